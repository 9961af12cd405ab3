"""The detokenizer's fast paths (a byte-level tokenizer's byte table, and the tokenizers
library's ``DecodeStream``) emit exactly the deltas of its Python steps, for any token
sequence: split characters, special tokens, sampled (random) ids."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.byte_pieces import token_bytes
from inference.tokenizer import IncrementalDetokenizer, Tokenizer, _decode_stream
from tests.support.fakes import smollm2_tokenizer_dir

IM_END = 2  # SmolLM2's <|im_end|>, a special token


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


def deltas(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(t) for t in ids] + [detok.flush()]


def python_only(tok: Tokenizer, skip_special_tokens: bool) -> IncrementalDetokenizer:
    detok = tok.detokenizer(skip_special_tokens)
    detok._pieces = detok._stream = None
    return detok


def stream_only(tok: Tokenizer, skip_special_tokens: bool) -> IncrementalDetokenizer:
    detok = tok.detokenizer(skip_special_tokens)
    detok._pieces = None
    detok._backend, detok._stream = _decode_stream(tok, skip_special_tokens)
    return detok


def test_a_byte_level_tokenizer_takes_the_byte_table(tok: Tokenizer) -> None:
    detok = tok.detokenizer()
    assert detok._pieces is not None and detok._stream is None
    deltas(detok, tok.encode("Hi 👋🏽 世界"))
    assert detok._pieces is not None  # no fall-back was needed


def test_the_stream_path_is_taken_without_a_table(tok: Tokenizer) -> None:
    detok = stream_only(tok, True)
    assert detok._stream is not None
    deltas(detok, tok.encode("Hi 👋🏽 世界"))
    assert detok._stream is not None


def test_the_table_holds_each_tokens_bytes(tok: Tokenizer) -> None:
    table = tok.byte_pieces(False)
    assert table is not None and len(table) == len(tok.hf)
    assert b"".join(table[t] for t in tok.encode("naïve 👋")) == "naïve 👋".encode()
    assert tok.byte_pieces(True)[IM_END] == b"" and table[IM_END] == b"<|im_end|>"  # type: ignore[index]


def test_no_table_for_a_decoder_that_is_not_byte_level() -> None:
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models
    from transformers import PreTrainedTokenizerFast

    backend = RustTokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece()
    assert token_bytes(PreTrainedTokenizerFast(tokenizer_object=backend), True) is None


def test_an_id_past_the_table_falls_back_to_the_tokenizers_decode(tok: Tokenizer) -> None:
    ids = [*tok.encode("Hello"), len(tok.hf) + 5, *tok.encode(" world")]
    detok = tok.detokenizer()
    assert deltas(detok, ids) == deltas(python_only(tok, True), ids)
    assert detok._pieces is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(
        st.one_of(st.integers(0, 300), st.integers(0, 49151), st.sampled_from([0, 1, 2, 17, 28, 30])),
        max_size=40,
    ),
    skip=st.booleans(),
)
def test_fast_and_python_paths_emit_the_same_deltas(tok: Tokenizer, ids: list[int], skip: bool) -> None:
    python = deltas(python_only(tok, skip), ids)
    assert deltas(tok.detokenizer(skip), ids) == python
    assert deltas(stream_only(tok, skip), ids) == python


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40))
def test_fast_path_on_text_char_by_char(tok: Tokenizer, text: str) -> None:
    ids = [t for ch in text for t in tok.encode(ch)]
    fast = deltas(tok.detokenizer(), ids)
    assert fast == deltas(python_only(tok, True), ids) == deltas(stream_only(tok, True), ids)
    assert "".join(fast) == tok.decode(ids)


def test_invalid_and_truncated_bytes_are_replaced_as_the_tokenizer_does(tok: Tokenizer) -> None:
    from inference.byte_pieces import byte_level_alphabet

    byte_token = {b: tok.hf.convert_tokens_to_ids(c) for c, b in byte_level_alphabet().items()}
    # A character cut short by ASCII, a stray continuation byte, an encoded surrogate, and a
    # dangling lead byte at the end (flushed as U+FFFD).
    for raw in (b"\xe2\x82a", b"a\x80b", b"\xed\xa0\x80z", b"\xf0\x9f\x98\x80\xf0\x9f"):
        ids = [byte_token[b] for b in raw]
        assert b"".join(tok.byte_pieces(True)[t] for t in ids) == raw  # type: ignore[index]
        assert deltas(tok.detokenizer(), ids) == deltas(python_only(tok, True), ids)
        assert "".join(deltas(tok.detokenizer(), ids)) == raw.decode(errors="replace")
