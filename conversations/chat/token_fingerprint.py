"""Which model and tokenizer made a message's stored token ids.

Stored ids are reused verbatim in later prompts, which is only right under the tokenizer
that produced them: under another one the same numbers spell other text, or fall outside
the vocabulary. Each message stores this fingerprint next to its ids
(``Message.token_fingerprint``), and ids under any other fingerprint are ignored (the text
is tokenised again).
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from inference.tokenizer import Tokenizer

# Room left for the model's name in Message.token_fingerprint (max_length 128).
NAME_CHARS = 100

_digests: WeakKeyDictionary[Tokenizer, str] = WeakKeyDictionary()
_lock = threading.Lock()


def token_fingerprint(model_name: str, tokenizer: Tokenizer) -> str:
    """``<model name>#<16 hex digits of the tokenizer's hash>``. The hash covers the whole
    tokenizer definition where the backend can write it out (vocabulary, merges,
    normalisation, added tokens), else the vocabulary, plus the special tokens and the chat
    template. Computed once per tokenizer object (a few tens of milliseconds); call it off
    the event loop."""
    with _lock:
        digest = _digests.get(tokenizer)
        if digest is None:
            digest = _digests[tokenizer] = _tokenizer_digest(tokenizer)
    return f"{model_name[-NAME_CHARS:]}#{digest}"


def cached_fingerprint(model_name: str, tokenizer: Tokenizer) -> str | None:
    """``token_fingerprint`` if it was worked out for this tokenizer already (else None):
    cheap enough for the event loop."""
    digest = _digests.get(tokenizer)
    return f"{model_name[-NAME_CHARS:]}#{digest}" if digest is not None else None


def _tokenizer_digest(tokenizer: Tokenizer) -> str:
    hf = tokenizer.hf
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is not None:
        definition = backend.to_str()
    else:
        definition = json.dumps(sorted(hf.get_vocab().items()), ensure_ascii=False)
    extra = {
        "vocab_size": tokenizer.vocab_size,
        "special": sorted(zip(hf.all_special_tokens, hf.all_special_ids, strict=False)),
        "eos": list(tokenizer.eos_token_ids),
        "bos": tokenizer.bos_token_id,
        "chat_template": getattr(hf, "chat_template", None),
    }
    sha = hashlib.sha256(definition.encode())
    sha.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return sha.hexdigest()[:16]
