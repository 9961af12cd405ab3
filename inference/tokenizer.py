"""Tokenizer wrapper: plain encode/decode, the chat template, and streaming detokenisation.

Chat prompts with stable prefixes are ``inference.prompt``'s; ``encode_chat`` hands this
tokenizer to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from inference.byte_pieces import token_bytes
from inference.prompt import encode_chat
from inference.prompt.types import NATIVE_FIELDS
from inference.sampling import harmony
from inference.sampling.reasoning_parser import (
    CLOSE_TAG,
    OPEN_TAG,
    template_reasoning_format,
    template_reasoning_tags,
)

# Tokens that end a turn in common chat templates; whichever exist in the vocab
# count as EOS, so generation stops at the end of the assistant's turn.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "<|end|>", "</s>")


@cache
def _template_compiler() -> Callable[[str], Any] | None:
    """transformers' cached compiler of chat templates (the sandboxed environment with its
    ``raise_exception`` and ``strftime_now``), where this version has it; imported on first
    use, as this module is imported where transformers is not."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    return _compile_jinja_template


def _plain_strings(messages: list[dict]) -> bool:
    """Whether every message holds only a role and content that are ``str`` themselves
    (transformers would pass other values, ``None`` or a subclass, through its own
    conversions, and copies native fields such as ``tool_calls``)."""
    return all(len(m) == 2 and type(m["role"]) is str and type(m["content"]) is str for m in messages)


class Tokenizer:
    """Wraps a Hugging Face tokenizer (``AutoTokenizer``)."""

    def __init__(self, hf_tokenizer: Any, extra_eos_token_ids: Sequence[int] = ()) -> None:
        self.hf = hf_tokenizer
        vocab = hf_tokenizer.get_vocab()
        eos: list[int] = []
        candidates = [hf_tokenizer.eos_token_id, *extra_eos_token_ids]
        candidates += [vocab.get(tok) for tok in END_OF_TURN_TOKENS]
        for tid in candidates:
            if tid is not None and tid not in eos:
                eos.append(int(tid))
        template = getattr(hf_tokenizer, "chat_template", None)
        # How the model reasons, from its template's markers: "think", "harmony" or None;
        # (open, close) when it writes <think>…</think>.
        self.reasoning_format = template_reasoning_format(template)
        self.reasoning_tags = template_reasoning_tags(template)
        if self.reasoning_format == "harmony":
            # A harmony answer runs over several messages, each ended by <|end|>; the turn
            # ends at <|return|> (the answer) or <|call|> (a tool call).
            eos = [t for t in eos if t != vocab.get("<|end|>")]
            eos += [vocab[t] for t in ("<|return|>", "<|call|>") if t in vocab and vocab[t] not in eos]
        self.eos_token_ids: list[int] = eos
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id
        self.vocab_size: int = len(hf_tokenizer)
        # Special tokens the answer's parsers read (a tool call's or a reasoning channel's
        # markers), kept in the text even where special tokens are skipped.
        markers = _marker_tokens(hf_tokenizer, template, self.reasoning_format)
        self.marker_texts: dict[int, str] = {i: t for i, t in markers.items() if i not in eos}
        self._byte_pieces: dict[bool, list[bytes] | None] = {}
        self._backend = _rust_tokenizer(hf_tokenizer)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS or other special tokens added. A fast
        tokenizer's own library encodes (half the time of the call through transformers,
        which every prompt segment pays)."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` of each text, in one call to a fast tokenizer's library (which spreads
        a long list over the cores: a long prompt's segments), without the character offsets
        it would otherwise work out (a fifth of the time) where the library can leave them."""
        if self._backend is None:
            return [self.encode(text) for text in texts]
        batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        return [e.ids for e in batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(
            list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The template's text for ``messages`` and ``tools`` (OpenAI-shaped, as transformers'
        ``apply_chat_template`` takes them): role, content and the native fields in
        ``NATIVE_FIELDS`` are passed on, so the template writes calls, results and reasoning
        its own way."""
        plain = [
            {"role": m["role"], "content": m["content"], **{k: m[k] for k in NATIVE_FIELDS if k in m}}
            for m in messages
        ]
        if not plain and not add_generation_prompt:
            return ""
        template = getattr(self.hf, "chat_template", None)
        compile_template = _template_compiler() if isinstance(template, str) else None
        if plain and not tools and compile_template is not None and _plain_strings(plain):
            # What transformers renders for such messages, without its per-call checking and
            # copying of every message (more than half of a long conversation's render).
            return compile_template(template).render(
                messages=plain,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.hf.special_tokens_map,
            )
        return self.hf.apply_chat_template(
            plain,
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def token_text(self, token_id: int) -> str:
        """The vocabulary's text for one id (a special token's name, e.g. ``<|im_end|>``)."""
        return self.hf.convert_ids_to_tokens(token_id)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Prompt ids for a conversation, stable across turns (``inference.prompt``: a
        message's ``"token_ids"`` are used verbatim); ``tools`` go to the template."""
        return encode_chat(self, messages, add_generation_prompt, tools)

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    def byte_pieces(self, skip_special_tokens: bool = True) -> list[bytes] | None:
        """Every id's bytes for a byte-level BPE tokenizer, else None
        (``inference.byte_pieces``); built once per setting (0.1-0.25 s for a 50k vocab)."""
        if skip_special_tokens not in self._byte_pieces:
            self._byte_pieces[skip_special_tokens] = token_bytes(self.hf, skip_special_tokens)
        return self._byte_pieces[skip_special_tokens]


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas, one per request.

    Byte-level BPE can split a UTF-8 character across tokens; decoding a partial
    character yields U+FFFD, so text ending in it is held back until the next token
    completes it. Each step decodes only a short window (from ``prefix_offset``) and
    emits the part past the previously emitted window text, so cost does not grow
    with the output length.

    A byte-level BPE tokenizer needs no decoding at all: each token's bytes come from a
    table (``Tokenizer.byte_pieces``) and the text not yet emitted is the UTF-8 of the
    bytes since the last emit, held back while it ends in a partial character. Another
    fast tokenizer runs the window logic in the tokenizers library's ``DecodeStream`` (the
    same algorithm, in Rust: one call per token instead of two decodes through
    transformers). Either way the offsets are mirrored here, so ``flush`` and a fall-back
    to the Python steps (an id outside the table, a token the stream refuses) continue
    from the same window.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.text_so_far = ""
        self._prefix_offset = 0  # window start
        self._read_offset = 0  # tokens up to here have been emitted as text
        self._pieces = tokenizer.byte_pieces(skip_special_tokens)
        self._markers = tokenizer.marker_texts if skip_special_tokens else {}
        self._pending = b""  # the bytes of the tokens past _read_offset (byte-level path)
        self._backend, self._stream = (
            _decode_stream(tokenizer, skip_special_tokens) if self._pieces is None else (None, None)
        )

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly "")."""
        token_id = int(token_id)
        if token_id in self._markers:
            return self._push_marker(token_id)
        self.token_ids.append(token_id)
        pieces = self._pieces
        if pieces is not None:
            if 0 <= token_id < len(pieces):
                return self._push_bytes(self._pending + pieces[token_id])
            self._pieces = None  # an id the tokenizer does not know: its own decode decides
        if self._stream is None:
            return self._push_python()
        try:
            delta = self._stream.step(self._backend, token_id)
        except Exception:  # e.g. the window's text stopped extending its prefix
            self._stream = None
            return self._push_python()
        if delta is None:
            return ""
        # _emitted, inline: this runs for every token of every stream.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        self.text_so_far += delta
        return delta

    def _push_marker(self, token_id: int) -> str:
        """A marker token: the text before it is complete, the marker's text follows, and
        decoding starts afresh after it."""
        text = self.flush() + self._markers[token_id]
        self.token_ids.append(token_id)
        self._prefix_offset = self._read_offset = len(self.token_ids)
        self.text_so_far += self._markers[token_id]
        if self._backend is not None:
            self._backend, self._stream = _decode_stream(self.tokenizer, self.skip_special_tokens)
        return text

    def _push_bytes(self, pending: bytes) -> str:
        try:
            text = pending.decode()
        except UnicodeDecodeError:  # a partial character, or invalid bytes (shown as U+FFFD)
            text = pending.decode(errors="replace")
        if not text or text.endswith("\ufffd"):
            self._pending = pending
            return ""
        self._pending = b""
        # _emitted, inline: this runs for every token of every stream.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        self.text_so_far += text
        return text

    def _push_python(self) -> str:
        prefix_text = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.token_ids[self._prefix_offset :])
        if new_text.endswith("\ufffd") or len(new_text) <= len(prefix_text):
            return ""  # an incomplete character (or a token that renders as nothing yet)
        return self._emitted(new_text[len(prefix_text) :])

    def _emitted(self, delta: str) -> str:
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        self.text_so_far += delta
        return delta

    def push_many(self, token_ids: Sequence[int]) -> str:
        return "".join(self.push(t) for t in token_ids)

    def flush(self) -> str:
        """Emit whatever is still held back (a dangling partial character becomes U+FFFD)."""
        if self._pieces is not None:
            delta, self._pending = self._pending.decode(errors="replace"), b""
            self._prefix_offset = self._read_offset = len(self.token_ids)
            self.text_so_far += delta
            return delta
        prefix_text = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.token_ids[self._prefix_offset :])
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset = len(self.token_ids)
        self.text_so_far += delta
        if self._stream is not None and delta:
            self._stream = None  # its window no longer matches ours
        return delta


def _marker_tokens(hf_tokenizer: Any, template: Any, reasoning_format: str | None) -> dict[int, str]:
    """Id -> text of the special tokens that mark tool calls or reasoning in the answers of
    this template's model (those a decode that skips special tokens would drop)."""
    from inference.tools.formats import FORMATS, template_format_name

    texts = set(FORMATS[template_format_name(template)].markers)
    if reasoning_format == "harmony":
        texts |= set(harmony.MARKERS)
    elif reasoning_format == "think":
        texts |= {OPEN_TAG, CLOSE_TAG}
    vocab = hf_tokenizer.get_vocab()
    found: dict[int, str] = {}
    for text in sorted(texts):
        token_id = vocab.get(text)
        if token_id is not None and not hf_tokenizer.decode([token_id], skip_special_tokens=True):
            found[int(token_id)] = text
    return found


# Leading and doubled spaces, a newline, non-ASCII text and the special tokens a chat
# template writes: where a tokenizer's Python class adds to its library's encoding.
_ENCODE_PROBE = " Hi  there\n<|im_start|>user naïve 👋<|im_end|></s><s> [INST]x"


def _rust_tokenizer(hf_tokenizer: Any) -> Any:
    """The tokenizers library's ``Tokenizer`` behind a fast tokenizer, where it encodes the
    probe as the tokenizer's ``encode`` does (a Python class may add to it); else None."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    try:
        from tokenizers import Tokenizer as RustTokenizer
    except ImportError:
        return None
    if not isinstance(backend, RustTokenizer):
        return None
    ours = backend.encode(_ENCODE_PROBE, add_special_tokens=False).ids
    if ours != list(hf_tokenizer.encode(_ENCODE_PROBE, add_special_tokens=False)):
        return None
    return backend


def _decode_stream(tokenizer: Tokenizer, skip_special_tokens: bool) -> tuple[Any, Any]:
    """(the tokenizers library's ``Tokenizer``, a fresh ``DecodeStream``) for a fast tokenizer
    (``Tokenizer.decode`` never cleans up spaces, so the two decode alike), else (None, None)."""
    backend = getattr(tokenizer.hf, "backend_tokenizer", None)
    if backend is None:
        return None, None
    try:
        from tokenizers import Tokenizer as RustTokenizer
        from tokenizers.decoders import DecodeStream
    except ImportError:  # tokenizers older than 0.21
        return None, None
    if not isinstance(backend, RustTokenizer):
        return None, None
    return backend, DecodeStream(skip_special_tokens=skip_special_tokens)
