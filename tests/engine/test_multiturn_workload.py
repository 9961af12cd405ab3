"""bench_multiturn's conversations and figures: the same texts every run, the sizes the flags set,
and percentiles, TTFT by turn and throughput as the report states them."""

from __future__ import annotations

import pytest

from benchmarks.multiturn_workload import TurnRecord, Workload, build_conversations, summarise


def test_conversations_share_the_system_prompt_and_repeat_across_runs() -> None:
    load = Workload(clients=3, turns=4)
    chats = build_conversations(load)
    assert chats == build_conversations(load)  # both servers see the same texts
    assert len(chats) == 3 and all(len(c.user_turns) == 4 for c in chats)
    assert len({c.system for c in chats}) == 1
    assert len(chats[0].system.split()) == load.system_words
    first = chats[0].user_turns[0]
    assert len(first.split()) >= load.document_words + load.user_words - 2
    assert chats[0].user_turns[0] != chats[1].user_turns[0]  # a document per conversation
    assert all(len(turn.split()) == load.user_words for turn in chats[0].user_turns[1:])


def test_summary_splits_first_and_warm_turns() -> None:
    records = [
        TurnRecord(
            client=0,
            turn=0,
            sent=0.0,
            first_token=2.0,
            finished=3.0,
            token_times=[2.0, 2.5, 3.0],
            output_tokens=3,
        ),
        TurnRecord(
            client=1, turn=0, sent=1.0, first_token=5.0, finished=6.0, token_times=[5.0, 6.0], output_tokens=2
        ),
        TurnRecord(
            client=0, turn=1, sent=4.0, first_token=4.5, finished=5.0, token_times=[4.5, 5.0], output_tokens=2
        ),
        TurnRecord(
            client=1, turn=1, sent=7.0, first_token=7.25, finished=8.0, token_times=[7.25], output_tokens=1
        ),
    ]
    figures = summarise(records, wall_s=8.0)
    assert figures["first_turn_ttft_p50"] == pytest.approx(4.0)  # of 2 s and 4 s, the upper middle
    assert figures["warm_ttft_p50"] == pytest.approx(0.5)
    assert figures["ttft_by_turn"][1] == {"p50": pytest.approx(0.5), "p90": pytest.approx(0.5)}
    assert figures["itl_p50"] == pytest.approx(0.5)
    assert figures["itl_p99"] == pytest.approx(1.0)
    # Per output token after the first: 0.5, 1.0 and 0.5 s (a one-token turn has none).
    assert figures["tpot_p50"] == pytest.approx(0.5) and figures["tpot_p90"] == pytest.approx(1.0)
    assert figures["output_tokens"] == 8 and figures["tokens_per_s"] == pytest.approx(1.0)


def test_the_engine_alone_runs_every_turn_with_its_history(tiny) -> None:
    from benchmarks.bench_multiturn_engine import run

    load = Workload(clients=2, turns=3, answer_tokens=4, stagger_s=0.0, think_s=0.0, document_words=30)
    engine = tiny.engine()
    figures = run(engine, load)
    assert figures["turns"] == 6 and figures["output_tokens"] == 6 * 4
    assert set(figures["ttft_by_turn"]) == {0, 1, 2}
    assert 0 < figures["warm_ttft_p50"] < figures["wall_s"]
    assert figures["tokens_per_s"] > 0
    assert engine.stats().prefix_hit_tokens > 0  # later turns found their histories cached
    engine.close()
