"""Each token's raw bytes, for tokenizers whose decoder is plain byte-level BPE.

Such a decoder (GPT-2's, and that of SmolLM2, Llama 3, Qwen) maps every token to a string of
bytes on its own and decodes a sequence as the UTF-8 of their concatenation, invalid bytes
replaced. So a stream of tokens decodes incrementally by concatenating bytes and emitting the
text once it ends on a whole character: a table lookup per token instead of a call into the
tokenizers library. Other decoders (SentencePiece's, which strip or replace by context) get
no table.

The table is checked against the tokenizer itself: every id's bytes must decode to what the
tokenizer decodes for that id alone, else there is no table.
"""

from __future__ import annotations

import re
from typing import Any


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-ins for the 256 byte values: printable Latin-1 bytes stand for
    themselves, the others are shifted past U+0100."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return {c: b for b, c in chars.items()}


def token_bytes(hf_tokenizer: Any, skip_special_tokens: bool) -> list[bytes] | None:
    """Every id's bytes (``b""`` for the special tokens skipped), or None when the tokenizer
    is not a fast one with a byte-level decoder or any id decodes otherwise."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        from tokenizers.decoders import ByteLevel
    except ImportError:
        return None
    if type(backend.decoder) is not ByteLevel:
        return None
    alphabet = byte_level_alphabet()
    # A token of the alphabet's characters maps to bytes through Latin-1; one with any other
    # character (an added token) decodes as its own UTF-8.
    to_latin1 = str.maketrans({c: chr(b) for c, b in alphabet.items()})
    outside = re.compile("[^" + re.escape("".join(alphabet)) + "]")
    size = backend.get_vocab_size(with_added_tokens=True)
    tokens: list[str | None] = [None] * size
    for token, i in backend.get_vocab(with_added_tokens=True).items():
        if i < size:
            tokens[i] = token
    decoded = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=skip_special_tokens)
    table: list[bytes] = []
    for token, text in zip(tokens, decoded, strict=True):
        if token is None:
            return None
        raw = token.encode() if outside.search(token) else token.translate(to_latin1).encode("latin-1")
        if raw.decode(errors="replace") != text:
            if text:
                return None
            raw = b""  # a special token, skipped
        table.append(raw)
    return table
