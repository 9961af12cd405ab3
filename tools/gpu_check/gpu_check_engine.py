"""Part 3 of ``python -m tools.gpu_check.gpu_check``: the engine (``inference.LLMEngine``) on
random weights: greedy tokens with CUDA graphs equal to eager ones (fp32, the pass/fail
check of the graphs), then throughput eager and with CUDA graphs for the shapes of
SmolLM2-135M and of Llama-3.2-1B. This part is guarded: if the engine cannot be imported
or fails, the kernel rows still print. Under ``--cpu-smoke`` it runs a tiny CPU model."""

from __future__ import annotations

import gc
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from tools.gpu_check.gpu_check_common import Report, Row

# HF config overrides for tests.support.fakes.make_tiny_model_dir. The vocabulary stays
# SmolLM2's (the tokenizer shipped with the test models), so the 1B model's LM head
# is 49152 wide instead of Llama-3.2's 128256.
ENGINE_MODELS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        initializer_range=0.02,
        tie_word_embeddings=True,
    ),
    "llama-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        initializer_range=0.02,
        tie_word_embeddings=True,
    ),
}


# ---- 3. engine -------------------------------------------------------------------------------


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def make_engine(path: str, loaded: Any, device: torch.device, dtype: str, enforce_eager: bool) -> Any:
    """An ``LLMEngine`` on already loaded weights (eager and graph engines share them).
    Only one engine may be alive at a time: each sizes its KV pool from free memory."""
    from inference.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine

    limits: dict[str, Any] = (
        dict(max_num_seqs=256, max_num_batched_tokens=8192, max_waiting=4096)
        if device.type == "cuda"
        else dict(num_kv_blocks=64, max_num_seqs=4)
    )
    config = EngineConfig(model=path, device=device.type, dtype=dtype, enforce_eager=enforce_eager, **limits)
    return LLMEngine(config, loaded=loaded)


def engine_generate(engine: Any, prompts: list[list[int]], params: list[Any]) -> list[list[int]]:
    """``LLM.generate`` on an engine we built: all prompts at once, stepped to the end."""
    requests = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    while engine.has_unfinished():
        engine.step()
    return [list(engine.request_output(r).outputs[0].token_ids) for r in requests]


def compare_tokens(a: list[list[int]], b: list[list[int]]) -> tuple[int, str]:
    """(sequences identical, where the first differing one diverges)."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            at = next((j for j, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y)))
            return same, f"seq {i} differs from output token {at} of {len(x)}"
    return same, ""


def graph_note(graphs: Any, device: torch.device, replays: int) -> tuple[str, bool]:
    """What the graph engine captured and replayed; False when CUDA graphs were expected
    but did not run (capture failed or was skipped: the engine logs why)."""
    if device.type != "cuda":
        return "no CUDA graphs on CPU", True
    if graphs is None:
        return "NO CUDA GRAPHS (capture failed or skipped, see log)", False
    sizes = graphs.sizes
    text = f"{len(sizes)} graphs (B {sizes[0]}..{sizes[-1]}) captured in {graphs.capture_s:.1f}s, {replays} replays"
    return text, replays > 0


def bench_engine(rep: Report, device: torch.device, tiny: bool) -> None:
    """Greedy equality of CUDA-graph and eager decoding (fp32, pass/fail), then engine
    throughput eager and with CUDA graphs on the same weights for each shape."""
    sec = "engine"
    try:
        from tests.support.fakes import make_tiny_model_dir
    except Exception as exc:  # the kernel rows above still stand
        rep.add(Row(sec, "import inference", f"{type(exc).__name__}: {exc}"[:100], status="ERROR"))
        return
    root = tempfile.mkdtemp(prefix="gpu-check-models-")
    try:
        if tiny or rep.left() >= 45:
            rep.guard(
                sec,
                "greedy graphs vs eager fp32",
                lambda: check_graph_greedy(rep, make_tiny_model_dir, root, device, tiny),
            )
        else:
            rep.add(Row(sec, "greedy graphs vs eager fp32", "skipped (time)", status="skip"))
        free_memory(device)
        if tiny:
            plans = [("tiny", {}, 4, 24, 8)]
        else:  # (name, overrides, prompts, prompt tokens, new tokens)
            plans = [(name, cfg, 256, 256, 128) for name, cfg in ENGINE_MODELS.items()]
        for name, overrides, num_prompts, prompt_len, new_tokens in plans:
            need = 120 if name == "llama-1b" else 60
            if not tiny and rep.left() < need:
                rep.add(Row(sec, name, "skipped (time)", status="skip"))
                continue
            rep.guard(
                sec,
                name,
                lambda n=name, o=overrides, k=num_prompts, pl=prompt_len, nt=new_tokens: run_engine(
                    rep, make_tiny_model_dir, root, n, o, k, pl, nt, device
                ),
            )
            free_memory(device)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check_graph_greedy(
    rep: Report, make_dir: Callable[..., Any], root: str, device: torch.device, tiny: bool
) -> None:
    """The pass/fail check of the CUDA graphs: the same greedy tokens with and without
    them. In fp32, on SmolLM2's shape with ``initializer_range`` 0.2 (as the tests' tiny
    models), so random logits have clear winners and rounding differences between a
    padded graph batch and an eager one (other GEMM kernels, other split-K) cannot
    flip an argmax. Varied prompt and output lengths make the decode batch shrink
    through many graph sizes, with padding rows that held finished sequences."""
    from inference.runner.model_loader import load_model
    from inference.sampling.params import SamplingParams

    overrides = {} if tiny else {**ENGINE_MODELS["smollm2-135m"], "initializer_range": 0.2}
    model = "tiny model" if tiny else "SmolLM2 shape, sharp random logits"
    path = str(make_dir(os.path.join(root, "sharp"), arch="llama", **overrides))
    loaded = load_model(path, device=device.type, dtype="float32")
    rng = random.Random(1)
    num = 6 if tiny else 96
    prompts = [
        [rng.randrange(100, 49000) for _ in range(rng.randint(8, 40 if tiny else 300))] for _ in range(num)
    ]
    params = [
        SamplingParams(max_tokens=rng.randint(4, 12 if tiny else 80), ignore_eos=True, temperature=0.0)
        for _ in range(num)
    ]
    tokens: dict[bool, list[list[int]]] = {}
    note, graphs_ok = "", True
    for eager in (True, False):
        engine = make_engine(path, loaded, device, "float32", enforce_eager=eager)
        tokens[eager] = engine_generate(engine, prompts, params)
        if not eager:
            graphs = engine.runner.cuda_graphs
            note, graphs_ok = graph_note(graphs, device, graphs.num_replays if graphs else 0)
            del graphs
        del engine
        free_memory(device)
    same, where = compare_tokens(tokens[True], tokens[False])
    ok = same == num and graphs_ok
    rep.add(
        Row(
            "engine",
            f"greedy tokens, CUDA graphs vs eager: fp32 {model}, {num} prompts of varied length",
            f"{same}/{num} sequences identical",
            "; ".join(x for x in (note, where) if x),
            "",
            "ok" if ok else "FAIL",
        )
    )
    del loaded


def run_engine(
    rep: Report,
    make_dir: Callable[..., Any],
    root: str,
    name: str,
    overrides: dict[str, Any],
    num_prompts: int,
    prompt_len: int,
    new_tokens: int,
    device: torch.device,
) -> None:
    """Throughput eager, then with CUDA graphs (one row each), on one copy of the weights;
    then how many greedy outputs agree. In bf16 that row is information, not a check:
    over long outputs of near-flat random logits, a 16-bit rounding difference between
    the padded graph batch and the eager one can flip an argmax and everything after it."""
    from inference.runner.model_loader import load_model
    from inference.sampling.params import SamplingParams

    t0 = time.perf_counter()
    path = str(make_dir(os.path.join(root, name), arch="llama", **overrides))
    made = time.perf_counter() - t0
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    t0 = time.perf_counter()
    loaded = load_model(path, device=device.type, dtype=dtype)
    load_s = time.perf_counter() - t0
    rng = random.Random(0)
    # Random ids, distinct per prompt from the first token, so prefix caching cannot help.
    prompts = [[rng.randrange(100, 49000) for _ in range(prompt_len)] for _ in range(num_prompts)]
    params = [SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0)] * num_prompts
    warm = min(8, num_prompts)
    tokens: dict[str, list[list[int]]] = {}
    walls: dict[str, float] = {}
    for mode in ("eager", "graphs"):
        t0 = time.perf_counter()
        engine = make_engine(path, loaded, device, dtype, enforce_eager=mode == "eager")
        start_s = time.perf_counter() - t0
        graphs = engine.runner.cuda_graphs
        engine_generate(engine, prompts[:warm], [SamplingParams(max_tokens=8, ignore_eos=True)] * warm)
        before = graphs.num_replays if graphs else 0
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        tokens[mode] = engine_generate(engine, prompts, params)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = walls[mode] = time.perf_counter() - t0
        out_tokens = sum(len(t) for t in tokens[mode])
        in_tokens = num_prompts * prompt_len
        ok = out_tokens == num_prompts * new_tokens
        detail = f"run {wall:.1f}s, engine start {start_s:.1f}s"
        if mode == "eager":
            detail += f", load {load_s:.1f}s, build {made:.1f}s"
        else:
            note, graphs_ok = graph_note(graphs, device, (graphs.num_replays if graphs else 0) - before)
            detail += f"; {note}"
            ok = ok and graphs_ok
        rep.add(
            Row(
                "engine",
                f"{name} {dtype} {mode}, random weights, {num_prompts} x ({prompt_len} in -> {new_tokens} out)",
                f"{out_tokens / wall:,.0f} out tok/s; {(in_tokens + out_tokens) / wall:,.0f} total tok/s",
                detail,
                "" if mode == "eager" else f"{walls['eager'] / wall:.2f}x eager",
                "ok" if ok else "FAIL",
            )
        )
        del engine, graphs
        free_memory(device)
    same, where = compare_tokens(tokens["eager"], tokens["graphs"])
    rep.add(
        Row(
            "engine",
            f"{name} {dtype} greedy tokens, CUDA graphs vs eager (information)",
            f"{same}/{num_prompts} sequences identical",
            where,
            "",
            "ok" if same == num_prompts else "info",
        )
    )
    del loaded
