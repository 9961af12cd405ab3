"""Part 2 of ``python -m tools.gpu_check.gpu_check``: kernel timings (GPU time, CUDA-graph
replay) against PyTorch: SDPA on K/V that are already gathered and contiguous (a lower
bound no paged engine reaches), the gather + SDPA the PyTorch path really does, and the
eager references."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from chatsite_kernels import reference as ref
from tools.gpu_check.gpu_check_common import Report, Row, dtype_name
from tools.gpu_check.gpu_check_kernels import SHAPES, Shape, make_paged, rope_cache

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
    from chatsite_kernels.triton import ops

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
