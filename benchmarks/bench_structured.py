"""Structured outputs on the default model (SmolLM2-135M-Instruct, CPU): what the grammar
mask costs, whether constrained outputs are valid, and how long grammars take to compile.

- *mask overhead*: mean decode-step time with 64 concurrent sequences, half of them under
  a JSON schema, against the same 64 with no grammar, run alternately in one process
  (target: <= 5% extra). The constrained half uses a schema that cannot finish within
  ``--steps`` tokens and the others ignore EOS, so every step carries all 64.
- *validity*: the 20 schemas of ``benchmarks/data/structured_schemas.json`` at temperature
  1.0, ``--max-tokens`` each: % whose output parses and validates (jsonschema); outputs cut
  by ``max_tokens`` are counted as invalid and reported apart.
- *compile time*: p50 / p99 of compiling those schemas (and each as a tool call's
  structural tag) with a fresh compiler (cold), and of asking for them again (cached).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_structured.py [--quick]

Printed only; no figure is asserted. A shared machine makes the seconds noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMAS = ROOT / "benchmarks" / "data" / "structured_schemas.json"
# Never finishes within the measured steps: every constrained sequence stays in the batch.
LONG_SCHEMA = {
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 500}},
    "required": ["notes"],
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def load_engine(max_num_seqs: int):
    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(device="cpu", max_num_seqs=max_num_seqs, max_num_batched_tokens=4096))


def chat_ids(engine, text: str) -> list[int]:
    return engine.tokenizer.encode_chat([{"role": "user", "content": text}])


def decode_step_times(engine, constrained: bool, steps: int, seqs: int) -> list[float]:
    """Seconds per engine step once all ``seqs`` sequences decode."""
    from inference.sampling.params import SamplingParams
    from inference.structured import GrammarSpec

    schema = GrammarSpec.json_schema(LONG_SCHEMA)
    engine.grammars.compile(schema, timeout=60)
    for i in range(seqs):
        grammar = schema if constrained and i % 2 == 0 else None
        params = SamplingParams(
            temperature=1.0, max_tokens=steps + 4, ignore_eos=True, seed=i, grammar=grammar
        )
        engine.add_request(chat_ids(engine, f"Write note number {i} as JSON."), params, request_id=f"s{i}")
    times = []
    while engine.has_unfinished():
        started = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - started
        running = sum(len(r.seqs) for r in engine.scheduler.running)
        if running == seqs and all(s.num_output_tokens > 1 for r in engine.scheduler.running for s in r.seqs):
            times.append(elapsed)
    return times[:steps]


def mask_overhead(engine, steps: int, rounds: int, seqs: int = 64) -> None:
    from inference.engine import next_tokens

    base: list[float] = []
    masked: list[float] = []
    in_masks: list[float] = []  # time inside apply_grammar_masks, per call (the direct cost)
    original = next_tokens.apply_grammar_masks

    def timed(logits, rows):
        started = time.perf_counter()
        out = original(logits, rows)
        if any(seq.grammar is not None for seq in rows):
            in_masks.append(time.perf_counter() - started)
        return out

    decode_step_times(engine, True, 2, seqs)  # warm-up: compile, first xgrammar calls
    next_tokens.apply_grammar_masks = timed
    try:
        for _ in range(rounds):
            base += decode_step_times(engine, False, steps, seqs)
            masked += decode_step_times(engine, True, steps, seqs)
    finally:
        next_tokens.apply_grammar_masks = original
    b, m = statistics.mean(base), statistics.mean(masked)
    mask = statistics.median(in_masks)
    print(f"mask overhead: {seqs} sequences ({seqs // 2} under a JSON schema), {len(base)} decode steps each")
    print(f"  step without masks {b * 1000:.1f} ms, with masks {m * 1000:.1f} ms: {100 * (m / b - 1):+.1f}%")
    print(f"  medians {statistics.median(base) * 1000:.1f} ms vs {statistics.median(masked) * 1000:.1f} ms")
    print(
        f"  filling and applying the masks: median {mask * 1000:.2f} ms per step ({100 * mask / b:.1f}% of a step)"
    )


def validity(engine, max_tokens: int) -> None:
    import jsonschema

    from inference.sampling.params import SamplingParams
    from inference.structured import GrammarSpec

    entries = json.loads(SCHEMAS.read_text())
    requests = []
    for i, entry in enumerate(entries):
        prompt = f"Reply with JSON only: {entry['describe']}. Schema: {json.dumps(entry['schema'])}"
        params = SamplingParams(
            temperature=1.0, max_tokens=max_tokens, seed=i, grammar=GrammarSpec.json_schema(entry["schema"])
        )
        requests.append(engine.add_request(chat_ids(engine, prompt), params, request_id=f"v{i}"))
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    elapsed = time.perf_counter() - started
    valid = cut = 0
    for entry, request in zip(entries, requests, strict=True):
        out = engine.request_output(request).outputs[0]
        if out.finish_reason == "length":
            cut += 1
            print(f"  cut at max_tokens: {entry['describe']}: {out.text[:80]!r}")
            continue
        try:
            jsonschema.validate(json.loads(out.text), entry["schema"])
            valid += 1
        except (ValueError, jsonschema.ValidationError) as exc:
            print(f"  INVALID {entry['describe']}: {out.text!r} ({str(exc).splitlines()[0]})")
    n = len(entries)
    print(
        f"validity: {valid}/{n} schema-valid ({100 * valid / n:.0f}%) at temperature 1.0, max_tokens {max_tokens}"
    )
    print(f"  cut by max_tokens: {cut}; invalid otherwise: {n - valid - cut}; {elapsed:.1f} s for all {n}")


def compile_times(engine, rounds: int) -> None:
    from inference.structured import GrammarCompiler, GrammarSpec

    entries = json.loads(SCHEMAS.read_text())
    specs = [GrammarSpec.json_schema(e["schema"]) for e in entries]
    specs += [
        GrammarSpec.structural_tag(
            {
                "type": "structural_tag",
                "format": {
                    "type": "triggered_tags",
                    "triggers": ["<tool_call>"],
                    "tags": [
                        {
                            "type": "tag",
                            "begin": f'<tool_call>\n{{"name": "f{i}", "arguments": ',
                            "content": {"type": "json_schema", "json_schema": e["schema"]},
                            "end": "}\n</tool_call>",
                        }
                    ],
                },
            }
        )
        for i, e in enumerate(entries)
    ]
    cold: list[float] = []
    cached: list[float] = []
    for _ in range(rounds):
        compiler = GrammarCompiler(engine.tokenizer, engine.model_config.vocab_size)
        compiler.compile(GrammarSpec.regex("warm"), timeout=60)  # tokenizer tables, built once per compiler
        for spec in specs:
            started = time.perf_counter()
            compiler.compile(spec, timeout=60)
            cold.append(time.perf_counter() - started)
        for spec in specs:
            started = time.perf_counter()
            compiler.compile(spec, timeout=60)
            cached.append(time.perf_counter() - started)
        compiler.close()
    print(f"compile time over {len(specs)} grammars x {rounds} rounds (20 schemas, 20 tool-call tags):")
    print(f"  cold   p50 {percentile(cold, 50) * 1000:.2f} ms, p99 {percentile(cold, 99) * 1000:.2f} ms")
    print(f"  cached p50 {percentile(cached, 50) * 1e6:.1f} us, p99 {percentile(cached, 99) * 1e6:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (about a minute or two)")
    parser.add_argument("--steps", type=int, help="decode steps measured per run (default 24, quick 8)")
    parser.add_argument("--max-tokens", type=int, default=160, help="validity: tokens per output")
    parser.add_argument("--skip", choices=["overhead", "validity", "compile"], action="append", default=[])
    args = parser.parse_args()
    steps = args.steps or (8 if args.quick else 24)
    rounds = 1 if args.quick else 3
    engine = load_engine(max_num_seqs=64)
    if "compile" not in args.skip:
        compile_times(engine, rounds)
    if "validity" not in args.skip:
        validity(engine, args.max_tokens)
    if "overhead" not in args.skip:
        mask_overhead(engine, steps, rounds)


if __name__ == "__main__":
    main()
