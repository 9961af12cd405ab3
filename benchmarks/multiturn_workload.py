"""The conversations and the figures of ``bench_multiturn``: texts, timings, percentiles.

The workload follows vLLM's multi-turn benchmark: every conversation opens with one shared
system prompt, then a document of its own with a question; later user turns are short, and
each turn re-sends the whole history with the previous answers. The words are drawn from a
fixed vocabulary with a fixed seed, so two runs (and two servers) see the same texts.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Any

WORDS = (
    "the a of to and in is it that for on with as was at by this from be are or an have not "
    "which one all their there can more when will about time would people into year some "
    "could them other than then now only its over also after work first well way even new "
    "want because any these give day most us river garden market letter window engine forest "
    "paper village number system history morning planet station mountain harbour library "
    "signal bridge winter summer question answer teacher student doctor kitchen island "
    "machine report council animal weather journey museum theatre factory company language "
    "simple quiet bright heavy careful early local public recent strange useful ancient "
    "explain describe compare measure follow notice remember consider improve discover"
).split()


@dataclass(frozen=True)
class Workload:
    """The size of a run, as the flags set it."""

    clients: int
    turns: int
    system_words: int = 250
    document_words: int = 600
    user_words: int = 40
    answer_tokens: int = 48
    stagger_s: float = 0.5
    think_s: float = 0.5
    seed: int = 0


@dataclass
class Conversation:
    """One client's texts: its first user message (document and question) and later turns."""

    system: str
    user_turns: list[str]


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def build_conversations(load: Workload) -> list[Conversation]:
    rng = random.Random(load.seed)
    system = "You are a helpful assistant for a reading group. " + words(rng, load.system_words - 9)
    conversations = []
    for index in range(load.clients):
        document = words(rng, load.document_words)
        first = f"Document {index}:\n{document}\n\nQuestion: {words(rng, load.user_words - 2)}?"
        later = [f"{words(rng, load.user_words)}?" for _ in range(load.turns - 1)]
        conversations.append(Conversation(system=system, user_turns=[first, *later]))
    return conversations


@dataclass
class TurnRecord:
    """One answered turn as the client saw it (monotonic seconds)."""

    client: int
    turn: int
    sent: float
    first_token: float | None = None
    finished: float = 0.0
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    text: str = ""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(records: list[TurnRecord], wall_s: float) -> dict[str, Any]:
    """TTFT p50/p90 by turn, warm turns (2 on) and first turns; inter-token p50/p99 (gaps
    between content events); time per output token p50/p90 (each turn's time from its
    first to its last content event over its tokens after the first); output tokens/s over
    the run's wall clock.

    ``llama-server`` sends one token per event; our server hands a stream its new tokens
    at most every ``ENGINE_STREAM_INTERVAL_MS`` with at least two steps' tokens per event,
    so its event gaps span several tokens: the time per output token compares the two."""
    by_turn: dict[int, list[float]] = {}
    for record in records:
        if record.first_token is not None:
            by_turn.setdefault(record.turn, []).append(record.first_token - record.sent)
    warm = [t for turn, values in by_turn.items() if turn > 0 for t in values]
    gaps = [b - a for r in records for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    tokens = sum(r.output_tokens for r in records)
    per_token = [
        (r.token_times[-1] - r.token_times[0]) / (r.output_tokens - 1)
        for r in records
        if r.output_tokens > 1 and len(r.token_times) > 1
    ]
    return {
        "ttft_by_turn": {
            turn: {"p50": percentile(v, 0.5), "p90": percentile(v, 0.9)}
            for turn, v in sorted(by_turn.items())
        },
        "first_turn_ttft_p50": percentile(by_turn.get(0, []), 0.5),
        "warm_ttft_p50": percentile(warm, 0.5),
        "warm_ttft_p90": percentile(warm, 0.9),
        "itl_p50": percentile(gaps, 0.5),
        "itl_p99": percentile(gaps, 0.99),
        "tpot_p50": percentile(per_token, 0.5),
        "tpot_p90": percentile(per_token, 0.9),
        "output_tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else float("nan"),
        "wall_s": wall_s,
        "turns": len(records),
        "mean_turn_s": statistics.fmean(r.finished - r.sent for r in records) if records else float("nan"),
    }
