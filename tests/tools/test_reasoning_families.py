"""Reasoning per family, picked from the template: Qwen3's and SmolLM3's ``<think>``, gpt-oss's
harmony channels (with its special tokens kept in the text for the parsers)."""

from __future__ import annotations

import random

import pytest

from inference.sampling.harmony import HarmonySplitter
from inference.sampling.reasoning_parser import template_reasoning_format
from inference.tokenizer import Tokenizer
from inference.tools.formats import format_named
from tests.support.chat_templates import FAMILY_TEMPLATES, GPT_OSS, HARMONY_SPECIAL_TOKENS
from tests.support.fakes import smollm2_tokenizer_dir

HARMONY_CALL = (
    "<|channel|>analysis<|message|>The user wants the weather. Call the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Oslo"}<|call|>'
)
HARMONY_ANSWER = (
    "<|channel|>analysis<|message|>Think <first>.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is sunny <|in|> Oslo.<|return|>"
)


def _split(text: str, rng: random.Random | None) -> tuple[str, str]:
    splitter = HarmonySplitter()
    i = 0
    while i < len(text):
        k = len(text) if rng is None else rng.randint(1, 5)
        splitter.push(text[i : i + k])
        i += k
    splitter.flush()
    return splitter.reasoning, splitter.answer


@pytest.mark.parametrize("family", FAMILY_TEMPLATES)
def test_reasoning_format_follows_the_template(family: str) -> None:
    template, _, reasoning = FAMILY_TEMPLATES[family]
    assert template_reasoning_format(template) == reasoning


@pytest.mark.parametrize("seed", [None, *range(6)])
def test_harmony_channels_split_alike_however_streamed(seed) -> None:
    rng = None if seed is None else random.Random(seed)
    assert _split(HARMONY_ANSWER, rng) == ("Think <first>.", "Checking.\n\nIt is sunny <|in|> Oslo.")
    reasoning, answer = _split(HARMONY_CALL, rng)
    assert reasoning == "The user wants the weather. Call the tool."
    parsed = format_named("harmony").parse_answer(answer)
    assert parsed.content == "" and [(c.name, c.arguments) for c in parsed.calls] == [
        ("get_weather", '{"city": "Oslo"}')
    ]


def test_harmony_text_without_headers_is_answer() -> None:
    assert _split("Just an answer.", None) == ("", "Just an answer.")
    # Cut inside the analysis: all reasoning, nothing leaks into the answer.
    assert _split("<|channel|>analysis<|message|>Hmm, let me <|e", None) == ("Hmm, let me <|e", "")
    # Cut inside a header: no markup in either part.
    assert _split("<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|chan", None) == ("Hmm.", "")
    assert _split("<|channel|>analysis", None) == ("", "")


@pytest.fixture(scope="module")
def harmony_tokenizer() -> Tokenizer:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    hf.add_special_tokens({"additional_special_tokens": HARMONY_SPECIAL_TOKENS})
    hf.chat_template = GPT_OSS
    return Tokenizer(hf)


def test_harmony_markers_survive_detokenizing(harmony_tokenizer: Tokenizer) -> None:
    tok = harmony_tokenizer
    vocab = tok.hf.get_vocab()
    assert tok.reasoning_format == "harmony"
    assert vocab["<|return|>"] in tok.eos_token_ids and vocab["<|call|>"] in tok.eos_token_ids
    assert vocab["<|end|>"] not in tok.eos_token_ids
    assert tok.decode(tok.encode("<|channel|>x")) == "x"  # special: a plain decode drops it
    ids = tok.encode(HARMONY_CALL.removesuffix("<|call|>"))
    detok = tok.detokenizer()
    splitter = HarmonySplitter()
    for token_id in ids:  # one token at a time, as the engine streams
        splitter.push(detok.push(token_id))
    splitter.push(detok.flush())
    splitter.flush()
    assert detok.text_so_far == HARMONY_CALL.removesuffix("<|call|>")
    assert splitter.reasoning == "The user wants the weather. Call the tool."
    calls = format_named("harmony").parse_answer(splitter.answer).calls
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]


def test_other_special_tokens_are_still_skipped(harmony_tokenizer: Tokenizer) -> None:
    tok = harmony_tokenizer
    ids = tok.encode("<|im_start|>Hello")
    detok = tok.detokenizer()
    assert detok.push_many(ids) + detok.flush() == "Hello"
