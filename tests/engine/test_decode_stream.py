"""The detokenizer's fast path (the tokenizers library's ``DecodeStream``) emits exactly the
deltas of its Python steps, for any token sequence: split characters, special tokens,
sampled (random) ids."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.support.fakes import smollm2_tokenizer_dir


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


def deltas(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(t) for t in ids] + [detok.flush()]


def python_only(tok: Tokenizer, skip_special_tokens: bool) -> IncrementalDetokenizer:
    detok = tok.detokenizer(skip_special_tokens)
    detok._stream = None
    return detok


def test_the_fast_path_is_taken(tok: Tokenizer) -> None:
    detok = tok.detokenizer()
    assert detok._stream is not None
    deltas(detok, tok.encode("Hi 👋🏽 世界"))
    assert detok._stream is not None  # no fall-back was needed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(
        st.one_of(st.integers(0, 300), st.integers(0, 49151), st.sampled_from([0, 1, 2, 17, 28, 30])),
        max_size=40,
    ),
    skip=st.booleans(),
)
def test_fast_and_python_paths_emit_the_same_deltas(tok: Tokenizer, ids: list[int], skip: bool) -> None:
    assert deltas(tok.detokenizer(skip), ids) == deltas(python_only(tok, skip), ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40))
def test_fast_path_on_text_char_by_char(tok: Tokenizer, text: str) -> None:
    ids = [t for ch in text for t in tok.encode(ch)]
    fast = deltas(tok.detokenizer(), ids)
    assert fast == deltas(python_only(tok, True), ids)
    assert "".join(fast) == tok.decode(ids)
