"""One prepared check for a GPU machine: ``python -m inference.gpu_check``.

Needs no network and no model files. Three parts, one table at the end:

1. correctness of every Triton kernel on CUDA against ``kernels.reference``, in
   bf16 and fp16, over SmolLM2-135M, Llama-1B, head_dim-128 and no-GQA shapes
   (plus a decode captured in a CUDA graph and replayed on new inputs);
2. kernel timings (GPU time, CUDA-graph replay) against PyTorch: SDPA on K/V that
   are already gathered and contiguous (a lower bound no paged engine reaches),
   the gather + SDPA the PyTorch path really does, and the eager references;
3. the engine (``inference.LLMEngine``) on random weights: greedy tokens with CUDA
   graphs equal to eager ones (fp32, the pass/fail check of the graphs), then
   throughput eager and with CUDA graphs for the shapes of SmolLM2-135M and of
   Llama-3.2-1B. This part is guarded: if the engine cannot be imported or fails,
   the kernel rows still print.

Everything is budgeted to fit in 10 minutes (``--budget-s``). Exit status: 0 all
checks passed, 1 a check failed, 2 no CUDA device. ``--cpu-smoke`` runs the
correctness part under the Triton interpreter on CPU with tiny shapes, and the
engine part on a tiny CPU model: it checks this script, not the GPU.

Over 500 lines: a self-contained script for a lent GPU machine (kernels, graphs,
engine throughput), copied there alone; it is a tool, never imported by the runtime.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kernels import reference as ref

# Max abs error against the fp32 references. 16-bit runs feed bf16/fp16 operands to
# the tensor cores (P is rounded to 16 bits before P@V); outputs are O(1).
ATOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


@dataclass(frozen=True)
class Shape:
    name: str
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int


SHAPES = [
    Shape("smollm2-135m", 9, 3, 64, 16),
    Shape("llama-1b", 32, 8, 64, 16),
    Shape("d128-gqa4-bs32", 32, 8, 128, 32),
    Shape("mha-d128", 8, 8, 128, 16),
]
TINY_SHAPES = [Shape("smollm2-135m", 9, 3, 64, 16), Shape("mha-d128", 2, 2, 128, 32)]

# HF config overrides for inference.testing.make_tiny_model_dir. The vocabulary stays
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


@dataclass
class Row:
    section: str
    case: str
    ours: str
    baseline: str = ""
    ratio: str = ""
    status: str = "ok"


class Report:
    def __init__(self, budget_s: float, json_path: str | None = None) -> None:
        self.rows: list[Row] = []
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.json_path = json_path
        self.environment = ""

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        # Progress on stderr, so a run cut short by a timeout still shows how far it got.
        print(
            f"[{time.perf_counter() - self.start:6.1f}s] {row.section} | {row.case} | {row.ours} | "
            f"{row.baseline} | {row.ratio} | {row.status}",
            file=sys.stderr,
            flush=True,
        )
        self.save()

    def save(self) -> None:
        """Rewrite the JSON after every row, so a killed run still leaves its rows."""
        if self.json_path:
            elapsed = time.perf_counter() - self.start
            with open(self.json_path, "w") as fh:
                json.dump(
                    {
                        "environment": self.environment,
                        "elapsed_s": elapsed,
                        "rows": [asdict(r) for r in self.rows],
                    },
                    fh,
                    indent=1,
                )

    def guard(self, section: str, case: str, fn: Callable[[], None]) -> None:
        """Run one check; an exception becomes an ERROR row instead of ending the script."""
        try:
            fn()
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            self.add(
                Row(section, case, f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}", status="ERROR")
            )

    def failed(self) -> bool:
        return any(r.status in ("FAIL", "ERROR") for r in self.rows)

    def table(self) -> str:
        head = ["section", "case", "ours", "baseline", "ratio", "status"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            lines.append(f"| {r.section} | {r.case} | {r.ours} | {r.baseline} | {r.ratio} | {r.status} |")
        return "\n".join(lines)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- inputs ----------------------------------------------------------------------------------


@dataclass
class Paged:
    query: torch.Tensor
    pool: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    scale: float


def make_paged(
    pairs: list[tuple[int, int]], shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> Paged:
    """(query_len, context_len) pairs over a 2-layer pool with shuffled blocks; layer 1 is used,
    so the caches are strided views exactly as in the engine."""
    gen = torch.Generator().manual_seed(seed)
    # Random values are drawn on the device: the timing pools reach half a billion elements.
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    bs = shape.block_size
    per_seq = [-(-ctx // bs) for _, ctx in pairs]
    num_blocks = sum(per_seq) + 3
    pool = torch.randn(num_blocks, 2, 2, bs, shape.kv_heads, shape.head_dim, generator=dev_gen, device=device)
    pool = pool.to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(pairs), max(per_seq) + 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = perm[used : used + n]
        used += n
    q_lens = [q for q, _ in pairs]
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    query = torch.randn(qsl[-1], shape.q_heads, shape.head_dim, generator=dev_gen, device=device).to(dtype)
    return Paged(
        query=query,
        pool=pool,
        k_cache=pool[:, 0, 1],
        v_cache=pool[:, 1, 1],
        block_tables=tables.to(device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        context_lens=torch.tensor([c for _, c in pairs], dtype=torch.int32, device=device),
        scale=shape.head_dim**-0.5,
    )


def attention_ref(p: Paged) -> torch.Tensor:
    return ref.paged_attention_ref(
        p.query, p.k_cache, p.v_cache, p.block_tables, p.query_start_loc, p.context_lens, p.scale
    )


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def rope_cache(max_pos: int, head_dim: int, device: torch.device) -> torch.Tensor:
    inv_freq = 1.0 / (100000.0 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos, device=device).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


# ---- 1. correctness --------------------------------------------------------------------------


def check_correctness(rep: Report, device: torch.device, dtypes: list[torch.dtype], tiny: bool) -> None:
    from kernels import triton_ops as ops

    shapes = TINY_SHAPES if tiny else SHAPES
    prefill_pairs = (
        [(1, 40), (5, 18), (33, 33)] if tiny else [(1, 1328), (5, 18), (129, 463), (64, 64), (300, 2100)]
    )
    decode_lens = [1, 16, 17, 70] if tiny else [1, 15, 16, 17, 33, 300, 1328, 4000]
    sec = "correctness"

    def verdict(err: float, tol: float) -> tuple[str, str]:
        ok = math.isfinite(err) and err <= tol
        return f"max err {err:.2e}", "ok" if ok else "FAIL"

    for dtype in dtypes:
        tol = ATOL[dtype]
        for shape in shapes:
            tag = f"{dtype_name(dtype)} {shape.name}"

            def prefill(
                shape: Shape = shape, dtype: torch.dtype = dtype, tag: str = tag, tol: float = tol
            ) -> None:
                p = make_paged(prefill_pairs, shape, dtype, device)
                out = ops.paged_prefill_attention(
                    p.query, p.k_cache, p.v_cache, p.block_tables, p.query_start_loc, p.context_lens, p.scale
                )
                ours, status = verdict(max_err(out, attention_ref(p)), tol)
                rep.add(Row(sec, f"prefill {tag} {prefill_pairs}", ours, f"tol {tol:g}", "", status))

            def decode(
                shape: Shape = shape, dtype: torch.dtype = dtype, tag: str = tag, tol: float = tol
            ) -> None:
                p = make_paged([(1, n) for n in decode_lens], shape, dtype, device, seed=1)
                expected = attention_ref(p)
                for splits in (None, 1, 4):
                    out = ops.paged_decode_attention(
                        p.query,
                        p.k_cache,
                        p.v_cache,
                        p.block_tables,
                        p.context_lens,
                        p.scale,
                        num_splits=splits,
                    )
                    ours, status = verdict(max_err(out, expected), tol)
                    name = "auto" if splits is None else splits
                    rep.add(Row(sec, f"decode {tag} splits={name}", ours, f"tol {tol:g}", "", status))

            rep.guard(sec, f"prefill {tag}", prefill)
            rep.guard(sec, f"decode {tag}", decode)

        def store(dtype: torch.dtype = dtype) -> None:
            shape = shapes[0]
            pool = torch.randn(12, 2, 3, shape.block_size, shape.kv_heads, shape.head_dim).to(device, dtype)
            slots = torch.randperm(12 * shape.block_size)[:50].to(device)
            slots[::7] = -1
            kv = torch.randn(50, 2, shape.kv_heads, shape.head_dim).to(device, dtype)
            expected = pool.clone()
            ref.store_kv_ref(kv[:, 0], kv[:, 1], expected[:, 0, 2], expected[:, 1, 2], slots)
            ops.store_kv(kv[:, 0], kv[:, 1], pool[:, 0, 2], pool[:, 1, 2], slots)
            same = torch.equal(pool, expected)
            rep.add(
                Row(
                    sec,
                    f"store_kv {dtype_name(dtype)}",
                    "bit-exact" if same else "differs",
                    "",
                    "",
                    "ok" if same else "FAIL",
                )
            )

        def norm(dtype: torch.dtype = dtype, tol: float = tol) -> None:
            for hidden in (576, 2048):
                x = torch.randn(37, hidden, device=device).to(dtype)
                res = torch.randn(37, hidden, device=device).to(dtype)
                w = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
                out, new_res = ops.fused_add_rms_norm(x, res, w, 1e-5)
                ref_out, ref_res = ref.rms_norm_ref(x, w, 1e-5, res)
                # Outputs reach ~4: allow 2 ulps there (accumulation order differs).
                err = max(max_err(out, ref_out), max_err(new_res, ref_res))
                ours, status = verdict(err, 8 * torch.finfo(dtype).eps)
                rep.add(Row(sec, f"rmsnorm+add {dtype_name(dtype)} hidden={hidden}", ours, "", "", status))

        def rotary(dtype: torch.dtype = dtype) -> None:
            for shape in shapes[:2]:
                qkv = torch.randn(
                    64, (shape.q_heads + 2 * shape.kv_heads) * shape.head_dim, device=device
                ).to(dtype)
                q = qkv[:, : shape.q_heads * shape.head_dim].view(64, shape.q_heads, shape.head_dim)
                k = qkv[:, shape.q_heads * shape.head_dim : (shape.q_heads + shape.kv_heads) * shape.head_dim]
                k = k.view(64, shape.kv_heads, shape.head_dim)
                cache = rope_cache(4096, shape.head_dim, device)
                pos = torch.randint(0, 4096, (64,), device=device)
                rq, rk = ref.rotary_ref(q.clone(), k.clone(), pos, cache)
                ops.rotary_embedding_(q, k, pos, cache)
                ours, status = verdict(max(max_err(q, rq), max_err(k, rk)), 16 * torch.finfo(dtype).eps)
                rep.add(Row(sec, f"rotary {dtype_name(dtype)} {shape.name}", ours, "", "", status))

        rep.guard(sec, f"store_kv {dtype_name(dtype)}", store)
        rep.guard(sec, f"rmsnorm {dtype_name(dtype)}", norm)
        rep.guard(sec, f"rotary {dtype_name(dtype)}", rotary)

    if device.type == "cuda":
        rep.guard(sec, "decode in a CUDA graph", lambda: check_decode_graph(rep, device))


def check_decode_graph(rep: Report, device: torch.device) -> None:
    """Capture one decode call, then replay it on new lengths, tables and queries:
    the launcher must not bake host-side values of those tensors into the graph."""
    from kernels import triton_ops as ops

    shape, dtype = SHAPES[0], torch.bfloat16
    first = make_paged([(1, n) for n in (5, 300, 1000, 17)], shape, dtype, device, seed=2)
    second = make_paged([(1, n) for n in (900, 1, 64, 1100)], shape, dtype, device, seed=3)
    # Same pool size and table width for both, so the second's tensors fit the static buffers.
    width = max(first.block_tables.shape[1], second.block_tables.shape[1])
    num_blocks = max(first.pool.shape[0], second.pool.shape[0])

    def fit(p: Paged) -> Paged:
        pool = torch.zeros((num_blocks, *p.pool.shape[1:]), dtype=dtype, device=device)
        pool[: p.pool.shape[0]] = p.pool
        tables = torch.zeros(p.block_tables.shape[0], width, dtype=torch.int32, device=device)
        tables[:, : p.block_tables.shape[1]] = p.block_tables
        return Paged(
            p.query, pool, pool[:, 0, 1], pool[:, 1, 1], tables, p.query_start_loc, p.context_lens, p.scale
        )

    first, second = fit(first), fit(second)
    static = Paged(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(first).items()})
    static.k_cache, static.v_cache = static.pool[:, 0, 1], static.pool[:, 1, 1]

    def run() -> torch.Tensor:
        return ops.paged_decode_attention(
            static.query,
            static.k_cache,
            static.v_cache,
            static.block_tables,
            static.context_lens,
            static.scale,
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    errs = []
    for p in (first, second):
        for name in ("query", "pool", "block_tables", "context_lens"):
            getattr(static, name).copy_(getattr(p, name))
        graph.replay()
        torch.cuda.synchronize()
        errs.append(max_err(out, attention_ref(p)))
    err = max(errs)
    ok = err <= ATOL[dtype]
    rep.add(
        Row(
            "correctness",
            "decode bf16 captured in a CUDA graph, replayed on new inputs",
            f"max err {err:.2e}",
            f"tol {ATOL[dtype]:g}",
            "",
            "ok" if ok else "FAIL",
        )
    )


# ---- 2. timings ------------------------------------------------------------------------------


def gpu_time_us(fn: Callable[[], Any], graph: bool = True) -> float:
    """GPU time per call: CUDA-graph replay (what the engine's decode runs), so Python launch
    overhead does not hide small kernels; eager timing where a function cannot be captured."""
    import triton.testing

    if graph:
        return 1000 * triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
    return 1000 * triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def fmt_us(us: float) -> str:
    return f"{us:,.1f} us"


def bench_kernels(rep: Report, device: torch.device) -> None:
    from kernels import triton_ops as ops

    sec = "timing"
    dtype = torch.bfloat16
    decode_cases = [(1, 1024), (32, 1024), (128, 2048), (8, 8192)]
    prefill_cases = [(4, 1024, 1024), (4, 256, 2048), (1, 4096, 4096)]  # (seqs, new tokens, context)
    for shape in SHAPES[:2]:
        for batch, ctx in decode_cases:
            if rep.left() < 240:
                rep.add(Row(sec, f"decode {shape.name} B={batch} ctx={ctx}", "skipped (time)", status="skip"))
                continue
            rep.guard(
                sec,
                f"decode {shape.name} B={batch} ctx={ctx}",
                lambda s=shape, b=batch, c=ctx: bench_decode(rep, ops, s, b, c, dtype, device),
            )
        for seqs, new, ctx in prefill_cases:
            if rep.left() < 220:
                rep.add(
                    Row(sec, f"prefill {shape.name} {seqs}x{new} ctx={ctx}", "skipped (time)", status="skip")
                )
                continue
            rep.guard(
                sec,
                f"prefill {shape.name} {seqs}x{new} ctx={ctx}",
                lambda s=shape, n=seqs, q=new, c=ctx: bench_prefill(rep, ops, s, n, q, c, dtype, device),
            )
    if rep.left() > 200:
        rep.guard(sec, "small kernels", lambda: bench_small(rep, ops, dtype, device))


def bench_decode(
    rep: Report, ops: Any, shape: Shape, batch: int, ctx: int, dtype: torch.dtype, device: torch.device
) -> None:
    p = make_paged([(1, ctx)] * batch, shape, dtype, device)
    group = shape.q_heads // shape.kv_heads
    ours = gpu_time_us(
        lambda: ops.paged_decode_attention(
            p.query, p.k_cache, p.v_cache, p.block_tables, p.context_lens, p.scale
        )
    )
    # Pre-gathered contiguous K/V [B, Hkv, L, D]; the GQA group rides on SDPA's query-length
    # axis (same trick as the PyTorch path), so K/V are not repeated.
    nb = -(-ctx // shape.block_size)
    tables = p.block_tables[:, :nb].long()

    def gather(cache: torch.Tensor) -> torch.Tensor:
        return cache[tables].reshape(batch, nb * shape.block_size, shape.kv_heads, shape.head_dim)[:, :ctx]

    k = gather(p.k_cache).transpose(1, 2).contiguous()
    v = gather(p.v_cache).transpose(1, 2).contiguous()
    q = p.query.view(batch, shape.kv_heads, group, shape.head_dim)
    sdpa = gpu_time_us(lambda: F.scaled_dot_product_attention(q, k, v, scale=p.scale))
    gathered = gpu_time_us(
        lambda: F.scaled_dot_product_attention(
            q, gather(p.k_cache).transpose(1, 2), gather(p.v_cache).transpose(1, 2), scale=p.scale
        )
    )
    kv_bytes = 2 * batch * ctx * shape.kv_heads * shape.head_dim * p.pool.element_size()
    rep.add(
        Row(
            "timing",
            f"decode {dtype_name(dtype)} {shape.name} B={batch} ctx={ctx}",
            f"{fmt_us(ours)} ({kv_bytes / ours / 1e3:,.0f} GB/s)",
            f"SDPA {fmt_us(sdpa)}; gather+SDPA {fmt_us(gathered)}",
            f"{sdpa / ours:.2f}x / {gathered / ours:.2f}x",
        )
    )


def bench_prefill(
    rep: Report,
    ops: Any,
    shape: Shape,
    seqs: int,
    new: int,
    ctx: int,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    p = make_paged([(new, ctx)] * seqs, shape, dtype, device)
    ours = gpu_time_us(
        lambda: ops.paged_prefill_attention(
            p.query, p.k_cache, p.v_cache, p.block_tables, p.query_start_loc, p.context_lens, p.scale
        )
    )
    group = shape.q_heads // shape.kv_heads
    nb = -(-ctx // shape.block_size)
    tables = p.block_tables[:, :nb].long()

    def gather(cache: torch.Tensor) -> torch.Tensor:
        flat = cache[tables].reshape(seqs, nb * shape.block_size, shape.kv_heads, shape.head_dim)[:, :ctx]
        return flat.transpose(1, 2).repeat_interleave(group, dim=1).contiguous()  # [B, Hq, L, D]

    k, v = gather(p.k_cache), gather(p.v_cache)
    q = p.query.view(seqs, new, shape.q_heads, shape.head_dim).transpose(1, 2)
    if new == ctx:
        sdpa_fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=p.scale)  # noqa: E731
    else:
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(new, ctx)
        sdpa_fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=p.scale)  # noqa: E731
    sdpa = gpu_time_us(sdpa_fn)
    # Causal FLOPs: each new token sees (ctx - new + its index + 1) keys; 4 flops per q.k.v.
    pairs = seqs * (new * (ctx - new) + new * (new + 1) / 2)
    tflops = 4 * pairs * shape.q_heads * shape.head_dim / (ours * 1e-6) / 1e12
    rep.add(
        Row(
            "timing",
            f"prefill {dtype_name(dtype)} {shape.name} {seqs}x{new} new, ctx={ctx}",
            f"{fmt_us(ours)} ({tflops:,.0f} TFLOP/s)",
            f"SDPA (contiguous, flash/eff.) {fmt_us(sdpa)}",
            f"{sdpa / ours:.2f}x",
        )
    )


def bench_small(rep: Report, ops: Any, dtype: torch.dtype, device: torch.device) -> None:
    tokens = 4096
    for shape in SHAPES[:2]:
        bench_store(rep, ops, shape, tokens, dtype, device)
        bench_rotary(rep, ops, shape, tokens, dtype, device)
    for hidden in (576, 2048):
        bench_norm(rep, ops, hidden, tokens, dtype, device)


def bench_store(
    rep: Report, ops: Any, shape: Shape, tokens: int, dtype: torch.dtype, device: torch.device
) -> None:
    # Baseline: index_put with long indices. (The reference's boolean filter of slot -1
    # syncs with the host, so it cannot be captured; all slots are valid here.)
    num_blocks = tokens // shape.block_size + 8
    pool = torch.zeros(
        num_blocks, 2, 1, shape.block_size, shape.kv_heads, shape.head_dim, dtype=dtype, device=device
    )
    kc, vc = pool[:, 0, 0], pool[:, 1, 0]
    slots = torch.randperm(num_blocks * shape.block_size, device=device)[:tokens]
    key = torch.randn(tokens, shape.kv_heads, shape.head_dim, device=device).to(dtype)
    value = torch.randn_like(key)
    blocks, offs = slots // shape.block_size, slots % shape.block_size

    def torch_store() -> None:
        kc[blocks, offs] = key
        vc[blocks, offs] = value

    ours = gpu_time_us(lambda: ops.store_kv(key, value, kc, vc, slots))
    base = gpu_time_us(torch_store)
    rep.add(
        Row(
            "timing",
            f"store_kv {dtype_name(dtype)} {shape.name} T={tokens}",
            fmt_us(ours),
            f"torch index_put {fmt_us(base)}",
            f"{base / ours:.2f}x",
        )
    )


def bench_rotary(
    rep: Report, ops: Any, shape: Shape, tokens: int, dtype: torch.dtype, device: torch.device
) -> None:
    hq, hkv, d = shape.q_heads, shape.kv_heads, shape.head_dim
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=device).to(dtype)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    cache = rope_cache(8192, d, device)
    pos = torch.randint(0, 8192, (tokens,), device=device)
    ours = gpu_time_us(lambda: ops.rotary_embedding_(q, k, pos, cache))
    base = gpu_time_us(lambda: ref.rotary_ref(q, k, pos, cache))
    rep.add(
        Row(
            "timing",
            f"rotary {dtype_name(dtype)} {shape.name} T={tokens}",
            fmt_us(ours),
            f"rotary_ref (eager torch) {fmt_us(base)}",
            f"{base / ours:.2f}x",
        )
    )


def bench_norm(
    rep: Report, ops: Any, hidden: int, tokens: int, dtype: torch.dtype, device: torch.device
) -> None:
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    res = torch.randn(tokens, hidden, device=device).to(dtype)
    w = torch.ones(hidden, device=device, dtype=dtype)
    ours = gpu_time_us(lambda: ops.fused_add_rms_norm(x, res, w, 1e-5))
    base = gpu_time_us(lambda: ref.rms_norm_ref(x, w, 1e-5, res))
    rep.add(
        Row(
            "timing",
            f"rmsnorm+add {dtype_name(dtype)} hidden={hidden} T={tokens}",
            fmt_us(ours),
            f"rms_norm_ref (eager torch) {fmt_us(base)}",
            f"{base / ours:.2f}x",
        )
    )


# ---- 3. engine -------------------------------------------------------------------------------


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def make_engine(path: str, loaded: Any, device: torch.device, dtype: str, enforce_eager: bool) -> Any:
    """An ``LLMEngine`` on already loaded weights (eager and graph engines share them).
    Only one engine may be alive at a time: each sizes its KV pool from free memory."""
    from inference.config import EngineConfig
    from inference.engine import LLMEngine

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
        from inference.testing import make_tiny_model_dir
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
    from inference.model_loader import load_model
    from inference.sampling_params import SamplingParams

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
    from inference.model_loader import load_model
    from inference.sampling_params import SamplingParams

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


# ---- main ------------------------------------------------------------------------------------


def environment(device: torch.device) -> str:
    import triton

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)"
    cuda = torch.version.cuda or "-"
    return (
        f"{dt.datetime.now().isoformat(timespec='seconds')} | {gpu} | torch {torch.__version__} | "
        f"triton {triton.__version__} | CUDA {cuda}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting new work after this")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="no GPU: run the correctness part under the Triton interpreter (tiny shapes) "
        "and the engine part on a tiny CPU model, to check this script",
    )
    args = parser.parse_args(argv)

    if args.cpu_smoke:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("--cpu-smoke: triton was imported before TRITON_INTERPRET=1 could be set", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first decorated
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False). Run it on a GPU "
            "machine, or use --cpu-smoke to check the script under the Triton interpreter.",
            file=sys.stderr,
        )
        return 2
    else:
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references must stay fp32

    rep = Report(args.budget_s, args.json)
    header = rep.environment = environment(device)
    print(header, file=sys.stderr, flush=True)

    def out_of_time(signum: int, frame: Any) -> None:
        raise TimeoutError("gpu_check budget exhausted")

    if hasattr(signal, "SIGALRM"):
        # A hung or slow step becomes an ERROR row (and later parts skip), and the
        # table is still printed before an outer time limit kills the process.
        signal.signal(signal.SIGALRM, out_of_time)
        signal.alarm(int(args.budget_s) + 20)
    dtypes = [torch.float32, torch.bfloat16] if args.cpu_smoke else [torch.bfloat16, torch.float16]
    try:
        check_correctness(rep, device, dtypes, tiny=args.cpu_smoke)
        if not args.skip_timing and device.type == "cuda":
            bench_kernels(rep, device)
        if not args.skip_engine:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()  # give the engine's KV sizing the memory the benchmarks held
            bench_engine(rep, device, tiny=args.cpu_smoke)
    except TimeoutError as exc:  # raised between guarded checks
        rep.add(Row("run", "time budget", str(exc), status="ERROR"))
    finally:
        if hasattr(signal, "SIGALRM"):
            signal.alarm(0)

    elapsed = time.perf_counter() - rep.start
    print(f"\n{header} | {elapsed:.0f}s\n")
    print(rep.table())
    rep.save()
    return 1 if rep.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
