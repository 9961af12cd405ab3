"""``bench_multiturn``'s workload against the engine alone, in this process: the site's share.

The same conversations (``benchmarks.multiturn_workload``: texts, stagger, thinking, answer
length) go to an ``LLMEngine`` stepped here, with the site's engine options
(``chatsite.engine_settings.engine_options``, so ``ENGINE_*`` variables apply) and the chat
template through the engine's own tokenizer; each answer's text joins the history as a
client's would. A turn's first token and later tokens are timed when the step that made
them returns, so the figures are ``bench_multiturn``'s without the ASGI server, the ``/v1``
path, the event loop or an HTTP client: run both at one size, and the difference is what
the layers above the engine cost.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_multiturn_engine.py --clients 4 --turns 6
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.multiturn_workload import TurnRecord, Workload, build_conversations, summarise  # noqa: E402


@dataclass
class Client:
    """One conversation's progress: its messages so far and its turn in flight."""

    index: int
    messages: list[dict[str, str]]
    turns: list[str]
    next_turn: int = 0
    due: float | None = 0.0  # monotonic time its next turn is sent (None: one is in flight)
    request: Any = None
    record: TurnRecord | None = None
    records: list[TurnRecord] = field(default_factory=list)


def run(engine: Any, load: Workload) -> dict[str, Any]:
    """Every client's turns through ``engine``; ``summarise``'s figures."""
    from inference.sampling.params import SamplingParams  # noqa: PLC0415 - after sys.path

    params = SamplingParams(temperature=0, max_tokens=load.answer_tokens, ignore_eos=True)
    start = time.monotonic()
    clients = [
        Client(i, [{"role": "system", "content": c.system}], c.user_turns, due=start + i * load.stagger_s)
        for i, c in enumerate(build_conversations(load))
    ]
    tokenizer = engine.tokenizer
    while any(c.next_turn < len(c.turns) or c.request is not None for c in clients):
        now = time.monotonic()
        for c in clients:
            if c.request is None and c.due is not None and now >= c.due and c.next_turn < len(c.turns):
                c.messages.append({"role": "user", "content": c.turns[c.next_turn]})
                c.record = TurnRecord(client=c.index, turn=c.next_turn, sent=now)
                c.request = engine.add_request(tokenizer.encode_chat(c.messages), params)
                c.due = None
        if not engine.has_unfinished():
            due = [c.due for c in clients if c.due is not None and c.next_turn < len(c.turns)]
            if due:
                time.sleep(max(0.0, min(due) - time.monotonic()))
            continue
        engine.step()
        now = time.monotonic()
        for c in clients:
            if c.request is None or c.record is None:
                continue
            out = engine.request_output(c.request)
            made = len(out.token_ids) - c.record.output_tokens
            if made > 0:
                c.record.first_token = c.record.first_token or now
                c.record.token_times.append(now)
                c.record.output_tokens = len(out.token_ids)
            if out.finished:
                c.record.finished, c.record.text = now, out.text
                c.records.append(c.record)
                c.messages.append({"role": "assistant", "content": out.text})
                c.request, c.record, c.due = None, None, now + load.think_s
                c.next_turn += 1
    return summarise([r for c in clients for r in c.records], time.monotonic() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--answer-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    import chatsite  # noqa: F401, PLC0415 - the kernels' thread waits, set before torch loads
    from chatsite.engine_settings import engine_options  # noqa: PLC0415
    from inference.config import EngineConfig  # noqa: PLC0415
    from inference.engine.llm_engine import LLMEngine  # noqa: PLC0415

    engine = LLMEngine(EngineConfig.from_kwargs(**engine_options()))
    load = Workload(clients=args.clients, turns=args.turns, answer_tokens=args.answer_tokens)
    figures = run(engine, load)
    warm, first = figures["warm_ttft_p50"], figures["first_turn_ttft_p50"]
    print(
        f"engine alone: {args.clients} clients x {args.turns} turns, {figures['output_tokens']} output tokens"
    )
    print(
        f"  warm-turn TTFT p50 {warm:.3f} s, p90 {figures['warm_ttft_p90']:.3f} s; first turn p50 {first:.3f} s"
    )
    print(
        f"  per output token p50 {figures['tpot_p50'] * 1000:.1f} ms, p90 {figures['tpot_p90'] * 1000:.1f} ms; "
        f"{figures['tokens_per_s']:.1f} tok/s over {figures['wall_s']:.1f} s"
    )
    engine.close()


if __name__ == "__main__":
    main()
