"""The memory-pressure benchmark: multi-turn conversations over a KV pool that holds a
third of them, with the lower KV tiers off and on, in one process.

    python -m benchmarks.bench --memory-pressure [--quick] [--json FILE]

- **Workload.** ``conversations`` chats of ``turns`` turns; every round, each sends its
  next turn (its prompt starts with the previous prompt + answer ids exactly) and all
  run together. The pool is sized to a third of the final histories' blocks.
- **Configurations** (same model, same prompts, greedy): ``off`` = the pool alone;
  ``on`` = the disk tier (in a temporary directory) plus retention of the conversations
  whose "tab is open" (a quarter of them, marked after each of their turns).
- **Reported.** Hit tokens per tier, recomputed tokens (tokens the model ran beyond what
  a perfect cache would need: each turn's new tokens and its answer), output tokens/s,
  time to first token per turn, and the next-turn hit rate of the open conversations
  against the others. Separately: how much faster a history comes back from the disk
  tier than it is recomputed (the files sit in the OS page cache after being written,
  as they would on a busy server).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from typing import Any

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.kv.block_manager import BlockManager
from inference.sampling.params import SamplingParams

WORDS = "river mountain garden kitchen engine market science music history planet ocean forest city".split()


def _questions(
    conversations: int, turns: int, seed: int = 3, words: tuple[int, int] = (40, 70)
) -> list[list[str]]:
    rng = random.Random(seed)
    return [
        [
            f"Turn {t + 1}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) + "?"
            for t in range(turns)
        ]
        for _ in range(conversations)
    ]


def pool_blocks_for_a_third(
    tokenizer: Any, questions: list[list[str]], answer_tokens: int, block_size: int
) -> int:
    """A third of the blocks the final histories need (answers stood in by fixed ids)."""
    total = 0
    for conv in questions:
        messages: list[dict[str, Any]] = []
        for q in conv:
            messages += [
                {"role": "user", "content": q},
                {"role": "assistant", "content": "", "token_ids": [100] * answer_tokens},
            ]
        total += -(-len(tokenizer.encode_chat(messages)) // block_size)
    return max(8, total // 3)


def run_conversations(
    engine: LLMEngine, questions: list[list[str]], answer_tokens: int, open_tabs: set[int], retain: bool
) -> dict[str, Any]:
    tok, bs = engine.tokenizer, engine.block_manager.block_size
    histories: list[list[dict[str, Any]]] = [[] for _ in questions]
    previous: list[list[int]] = [[] for _ in questions]
    ttft_by_turn: list[float] = []
    needed = output = 0
    hits = {"open": [0, 0], "other": [0, 0]}  # [hit tokens, history tokens] from turn 2 on
    computed_before = engine.metrics.total_computed_tokens
    start = time.perf_counter()
    for turn in range(len(questions[0])):
        requests = []
        for c, conv in enumerate(questions):
            histories[c].append({"role": "user", "content": conv[turn]})
            prompt = tok.encode_chat(histories[c])
            assert prompt[: len(previous[c])] == previous[c], "history must be a token prefix"
            reusable = (len(previous[c]) - 1) // bs * bs if previous[c] else 0
            needed += len(prompt) - reusable + answer_tokens - 1
            params = SamplingParams(temperature=0, max_tokens=answer_tokens, ignore_eos=True)
            requests.append((c, prompt, engine.add_request(prompt, params)))
        while engine.has_unfinished():
            engine.step()
        ttfts = []
        for c, prompt, request in requests:
            out = engine.request_output(request)
            ttfts.append(request.first_token_time - request.arrival_time)
            output += len(out.token_ids)
            if turn:
                group = hits["open" if c in open_tabs else "other"]
                group[0] += request.num_cached_tokens
                group[1] += (len(previous[c]) - 1) // bs * bs
            histories[c].append({"role": "assistant", "content": out.text, "token_ids": out.token_ids})
            previous[c] = prompt + out.token_ids
            if retain and c in open_tabs:
                engine.retain(f"conversation:{c}", previous[c])
        ttft_by_turn.append(statistics.mean(ttfts))
    elapsed = time.perf_counter() - start
    stats = engine.stats()
    computed = engine.metrics.total_computed_tokens - computed_before
    return {
        "seconds": elapsed,
        "output_tokens": output,
        "tokens_per_s": output / elapsed,
        "computed_tokens": computed,
        "recomputed_tokens": max(0, computed - needed),
        "ttft_ms_by_turn": [t * 1000 for t in ttft_by_turn],
        "hit_tokens_by_tier": {name: t["hit_tokens"] for name, t in stats.kv_tiers.items()},
        "next_turn_hit_rate_open": hits["open"][0] / max(1, hits["open"][1]),
        "next_turn_hit_rate_other": hits["other"][0] / max(1, hits["other"][1]),
        "preemptions": stats.num_preemptions,
        "swaps": stats.num_swaps,
        "disk": stats.kv_tiers.get("disk", {}),
        "outputs": [p for p in previous],
    }


def reload_vs_recompute(loaded: Any, history_tokens: int, kv_dir: str) -> dict[str, float]:
    """Time to first token of a known history: recomputed (pool only, cache cold) against
    read back from the disk tier (pool cache emptied, blocks on disk)."""
    tokens = [(i * 7919) % 40000 + 100 for i in range(history_tokens)]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def ttft(engine: LLMEngine) -> float:
        request = engine.add_request(tokens, params)
        while engine.has_unfinished():
            engine.step()
        return request.first_token_time - request.arrival_time

    plain = LLMEngine(EngineConfig(num_kv_blocks=512), loaded=loaded)
    ttft(plain)  # warm-up
    plain.block_manager.reset_prefix_cache()
    recompute = min(_cold(plain, ttft) for _ in range(2))
    tiered = LLMEngine(EngineConfig(num_kv_blocks=512, kv_disk_dir=kv_dir), loaded=loaded)
    ttft(tiered)  # computes the history once and writes it through to disk
    tiered.tiers.disk.flush()
    tiered.tiers.prefill_s_per_token = None  # price recompute as unknown: always read
    reload = min(_cold(tiered, ttft) for _ in range(2))
    served = tiered.tiers.counters.loaded_blocks
    tiered.close()
    return {
        "history_tokens": history_tokens,
        "recompute_ms": recompute * 1000,
        "reload_ms": reload * 1000,
        "reload_speedup": recompute / reload,
        "blocks_read": served,
    }


def _cold(engine: LLMEngine, ttft: Any) -> float:
    bm: BlockManager = engine.block_manager
    bm.reset_prefix_cache()
    return ttft(engine)


def run_memory_pressure(loaded: Any, *, quick: bool = False, tiers_first: bool = False) -> dict[str, Any]:
    conversations, turns, answer_tokens = (12, 3, 16) if quick else (48, 4, 32)
    tokenizer = loaded[1]
    questions = _questions(conversations, turns)
    blocks = pool_blocks_for_a_third(tokenizer, questions, answer_tokens, EngineConfig.block_size)
    open_tabs = set(range(0, conversations, 4))  # a quarter of the conversations
    results: dict[str, Any] = {
        "conversations": conversations,
        "turns": turns,
        "answer_tokens": answer_tokens,
        "pool_blocks": blocks,
        "open_tabs": len(open_tabs),
    }
    with tempfile.TemporaryDirectory(prefix="kv-bench-") as kv_dir:

        def run(config: str) -> None:
            tiers = {"kv_disk_dir": f"{kv_dir}/tier"} if config == "on" else {}
            engine = LLMEngine(EngineConfig(num_kv_blocks=blocks, **tiers), loaded=loaded)
            results[config] = run_conversations(
                engine, questions, answer_tokens, open_tabs, retain=config == "on"
            )
            engine.close()

        # On a shared machine the load drifts: run both orders (--tiers-first) to see its effect.
        results["order"] = ["on", "off"] if tiers_first else ["off", "on"]
        for config in results["order"]:
            run(config)
        results["reload"] = reload_vs_recompute(loaded, 256 if quick else 1024, f"{kv_dir}/reload")
    same = results["on"].pop("outputs") == results["off"].pop("outputs")
    off_r, on_r = results["off"], results["on"]
    results["same_greedy_outputs"] = same
    results["ratios"] = {
        "throughput_on_over_off": on_r["tokens_per_s"] / off_r["tokens_per_s"],
        "recomputed_on_over_off": on_r["recomputed_tokens"] / max(1, off_r["recomputed_tokens"]),
        "reload_speedup": results["reload"]["reload_speedup"],
        "open_tab_next_turn_hit_rate": on_r["next_turn_hit_rate_open"],
    }
    return results


TARGETS = {
    "throughput_on_over_off": 1.3,
    "recomputed_on_over_off": 0.5,
    "reload_speedup": 5.0,
    "open_tab_next_turn_hit_rate": 0.95,
}


def print_memory_pressure(r: dict[str, Any]) -> None:
    ratios, off, on = r["ratios"], r["off"], r["on"]
    lower_is_better = {"recomputed_on_over_off"}

    def ok(name: str) -> str:
        good = ratios[name] <= TARGETS[name] if name in lower_is_better else ratios[name] >= TARGETS[name]
        return "yes" if good else "NO"

    rows = [
        (
            "memory pressure",
            f"{r['conversations']} conversations x {r['turns']} turns, pool of {r['pool_blocks']} blocks "
            f"(a third), {r['open_tabs']} open tabs; order {' then '.join(r['order'])}",
            "",
            "",
        ),
        ("tiers off: output tokens/s", f"{off['tokens_per_s']:.1f}", "", f"{off['seconds']:.1f} s"),
        ("tiers on: output tokens/s", f"{on['tokens_per_s']:.1f}", "", f"{on['seconds']:.1f} s"),
        (
            "throughput on / off",
            f"{ratios['throughput_on_over_off']:.2f}x",
            ">= 1.3x",
            ok("throughput_on_over_off"),
        ),
        ("recomputed tokens off", str(off["recomputed_tokens"]), "", f"{off['preemptions']} preemptions"),
        (
            "recomputed tokens on",
            str(on["recomputed_tokens"]),
            "",
            f"{on['preemptions']} preemptions, {on['swaps']} swaps",
        ),
        (
            "recomputed on / off",
            f"{ratios['recomputed_on_over_off']:.2f}",
            "<= 0.5",
            ok("recomputed_on_over_off"),
        ),
        ("hit tokens per tier, off", str(off["hit_tokens_by_tier"]), "", ""),
        ("hit tokens per tier, on", str(on["hit_tokens_by_tier"]), "", ""),
        ("TTFT per turn off (ms)", " ".join(f"{x:.0f}" for x in off["ttft_ms_by_turn"]), "", ""),
        ("TTFT per turn on (ms)", " ".join(f"{x:.0f}" for x in on["ttft_ms_by_turn"]), "", ""),
        (
            "open tabs: next-turn hit rate",
            f"{ratios['open_tab_next_turn_hit_rate']:.1%}",
            ">= 95%",
            f"{ok('open_tab_next_turn_hit_rate')}; others {on['next_turn_hit_rate_other']:.1%}, "
            f"tiers off {off['next_turn_hit_rate_open']:.1%}",
        ),
        (
            "disk reload vs recompute",
            f"{ratios['reload_speedup']:.1f}x",
            ">= 5x",
            f"{ok('reload_speedup')}; {r['reload']['history_tokens']} tokens: "
            f"{r['reload']['recompute_ms']:.0f} ms vs {r['reload']['reload_ms']:.0f} ms",
        ),
        ("same greedy outputs on and off", str(r["same_greedy_outputs"]), "True", ""),
    ]
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    print()
    for row in rows:
        print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip())
