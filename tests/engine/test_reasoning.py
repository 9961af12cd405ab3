"""Reasoning answers: ``<think>…</think>`` split off the answer text, in the splitter
and through the engine's stream with a model whose template marks reasoning."""

from __future__ import annotations

import pytest

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.sampling.params import SamplingParams
from inference.sampling.reasoning_parser import ReasoningSplitter, template_reasoning_tags
from tests.support.fakes import (
    R1_STYLE_TEMPLATE,
    SCRIPTED_ANSWER,
    SCRIPTED_REASONING,
    scripted_reasoning_model,
)

REASONING, ANSWER = SCRIPTED_REASONING, SCRIPTED_ANSWER


def feed(splitter: ReasoningSplitter, pieces: list[str]) -> tuple[str, str]:
    reasoning, answer = "", ""
    for piece in pieces:
        r, a = splitter.push(piece)
        reasoning, answer = reasoning + r, answer + a
    r, a = splitter.flush()
    return reasoning + r, answer + a


@pytest.mark.parametrize(
    ("text", "opened_by_prompt", "expected"),
    [
        ("\nLet me see.\n</think>\n\nIt is 4.", True, ("Let me see.", "It is 4.")),
        ("<think>\nHmm.</think>Yes.", False, ("Hmm.", "Yes.")),
        ("Just an answer <think> in the middle.", False, ("", "Just an answer <think> in the middle.")),
        (
            "Still thinking when the tokens ran out </thi",
            True,
            ("Still thinking when the tokens ran out </thi", ""),
        ),
        ("<thin", False, ("", "<thin")),
    ],
    ids=["prompt-opened", "output-opened", "no-reasoning", "cut-off-reasoning", "half-tag-answer"],
)
def test_splitter_gives_the_same_split_whatever_the_chunking(text, opened_by_prompt, expected) -> None:
    whole = feed(ReasoningSplitter(in_reasoning=opened_by_prompt), [text])
    by_char = feed(ReasoningSplitter(in_reasoning=opened_by_prompt), list(text))
    assert whole == by_char == expected


def test_splitter_holds_back_a_closing_tag_split_over_tokens() -> None:
    splitter = ReasoningSplitter(in_reasoning=True)
    assert splitter.push("Two plus two </") == ("Two plus two", "")
    assert splitter.push("think>") == ("", "")
    assert splitter.push(" Four.") == ("", "Four.")


def test_only_templates_that_mark_reasoning_get_tags() -> None:
    assert template_reasoning_tags(R1_STYLE_TEMPLATE) == ("<think>", "</think>")
    assert template_reasoning_tags("{{ messages[0]['content'] }}") is None


@pytest.fixture(scope="module")
def reasoning_engine():
    loaded = scripted_reasoning_model()
    engine = LLMEngine(EngineConfig(device="cpu", num_kv_blocks=16), loaded=loaded)
    return engine, engine.tokenizer.encode_chat([{"role": "user", "content": "Capital of France?"}])


def stream(engine: LLMEngine, prompt: list[int], params: SamplingParams):
    request = engine.add_request(prompt, params)
    deltas = []
    while engine.has_unfinished():
        deltas += engine.step()
    return deltas, engine.request_output(request)


def test_engine_streams_reasoning_apart_from_the_answer(reasoning_engine) -> None:
    engine, prompt = reasoning_engine
    assert engine.tokenizer.reasoning_tags == ("<think>", "</think>")
    deltas, output = stream(
        engine, prompt, SamplingParams(temperature=0, max_tokens=40, separate_reasoning=True)
    )
    assert "".join(d.reasoning for d in deltas) == REASONING == output.outputs[0].reasoning
    assert "".join(d.text for d in deltas) == ANSWER == output.text
    assert sum(1 for d in deltas if d.reasoning) > 1  # reasoning streams token by token
    assert output.finish_reason == "stop"


def test_without_separate_reasoning_the_text_stays_whole(reasoning_engine) -> None:
    engine, prompt = reasoning_engine
    deltas, output = stream(engine, prompt, SamplingParams(temperature=0, max_tokens=40))
    assert output.text == f"{REASONING}</think> {ANSWER}"
    assert all(d.reasoning == "" for d in deltas) and output.outputs[0].reasoning == ""


def test_reasoning_cut_off_by_max_tokens_is_all_reasoning(reasoning_engine) -> None:
    engine, prompt = reasoning_engine
    deltas, output = stream(
        engine, prompt, SamplingParams(temperature=0, max_tokens=3, separate_reasoning=True)
    )
    assert (
        output.text == ""
        and REASONING.startswith(output.outputs[0].reasoning)
        and output.outputs[0].reasoning
    )


def test_the_template_drops_earlier_reasoning_from_the_next_prompt(reasoning_engine) -> None:
    engine, prompt = reasoning_engine
    history = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "And of Spain?"},
    ]
    text = engine.tokenizer.decode(engine.tokenizer.encode_chat(history), skip_special_tokens=False)
    assert REASONING not in text and ANSWER in text and text.endswith("<think>\n")
