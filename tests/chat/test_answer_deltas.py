"""A chat answer's deltas handled in the engine's hand-over: the text, tokens, reasoning and
events a task reading the stream made; done at the request's end, at a stop, or with an
error; nothing after that."""

from __future__ import annotations

import asyncio

import pytest

from conversations.chat.answer_deltas import AnswerDeltas
from conversations.chat.records import Answer
from inference.engine.outputs import StreamDelta


def delta(text: str, ids: list[int], *, reasoning: str = "", last: str | None = None) -> StreamDelta:
    return StreamDelta(
        request_id="r",
        index=0,
        text=text,
        token_ids=ids,
        finished=last is not None,
        finish_reason=last,
        num_prompt_tokens=5,
        num_cached_tokens=3,
        num_output_tokens=len(ids),
        request_finished=last is not None,
        reasoning=reasoning,
    )


def sink() -> tuple[AnswerDeltas, Answer, list, list]:
    gen = Answer(message_id=7, conversation_id=3, owner_id=1, request_id="r")
    events: list[tuple[int, dict]] = []
    pokes: list[None] = []
    timing: dict[str, float] = {"started": 0.0}
    return (
        AnswerDeltas(gen, timing, lambda c, e: events.append((c, e)), lambda: pokes.append(None)),
        gen,
        events,
        pokes,
    )


async def test_deltas_build_the_answer_and_reach_the_tabs_until_the_last():
    deltas, gen, events, pokes = sink()
    deltas.put_nowait(delta("", [1], reasoning="Hmm"))
    deltas.put_nowait(delta("Par", [2, 3]))
    assert not deltas.done.done() and "first_token" in deltas.timing
    deltas.put_nowait(delta("is", [4], last="stop"))
    await asyncio.wait_for(deltas.done, 1)
    assert (gen.text, gen.reasoning.text, gen.token_ids) == ("Paris", "Hmm", [1, 2, 3, 4])
    assert gen.finish_reason == "stop" and gen.cached_tokens == 3 and deltas.request_finished
    assert [e for _, e in events] == [
        {"type": "delta", "conversation_id": 3, "message_id": 7, "text": "", "reasoning": "Hmm"},
        {"type": "delta", "conversation_id": 3, "message_id": 7, "text": "Par"},
        {"type": "delta", "conversation_id": 3, "message_id": 7, "text": "is"},
    ]
    assert len(pokes) == 3
    deltas.put_nowait(delta("late", [9]))  # nothing after the end
    assert gen.text == "Paris" and len(events) == 3


async def test_a_stopped_answer_is_done_at_its_next_delta_and_takes_nothing_after():
    deltas, gen, events, _ = sink()
    deltas.put_nowait(delta("One", [1]))
    gen.stop_reason = "user"
    deltas.put_nowait(delta(" two", [2]))
    await asyncio.wait_for(deltas.done, 1)
    assert not deltas.request_finished  # its task aborts the request
    deltas.put_nowait(delta(" three", [3], last="abort"))
    assert gen.text == "One two" and gen.finish_reason is None and len(events) == 2


async def test_the_engines_error_and_a_failure_in_handling_fail_the_answer():
    deltas, _, _, _ = sink()
    deltas.put_nowait(ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        await deltas.done
    assert deltas.request_finished  # the engine dropped it: nothing to abort

    gen = Answer(message_id=1, conversation_id=1, owner_id=1, request_id="r")

    def broken_emit(conversation_id: int, event: dict) -> None:
        raise RuntimeError("emit failed")

    failing = AnswerDeltas(gen, {}, broken_emit, lambda: None)
    failing.put_nowait(delta("x", [1]))
    with pytest.raises(RuntimeError, match="emit failed"):
        await failing.done
    assert not failing.request_finished


async def test_closing_drops_later_deltas():
    deltas, gen, events, _ = sink()
    deltas.close()
    assert deltas.done.cancelled()
    deltas.put_nowait(delta("x", [1]))
    assert gen.text == "" and events == []
