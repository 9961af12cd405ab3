"""Part 1 of ``python -m tools.gpu_check.gpu_check``: correctness of every Triton kernel on
CUDA against ``chatsite_kernels.reference``, in bf16 and fp16, over SmolLM2-135M, Llama-1B,
head_dim-128 and no-GQA shapes (plus a decode captured in a CUDA graph and replayed on
new inputs). Also the shapes and paged inputs the timings reuse. Under ``--cpu-smoke``
it runs under the Triton interpreter on CPU with tiny shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from types import ModuleType

import torch

from chatsite_kernels import reference as ref
from tools.gpu_check.gpu_check_common import ATOL, Report, Row, dtype_name


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

SECTION = "correctness"


@dataclass(frozen=True)
class Sizes:
    """What one run covers: the head shapes, the prefill (query, context) pairs and the
    decode context lengths."""

    shapes: list[Shape]
    prefill_pairs: list[tuple[int, int]]
    decode_lens: list[int]


FULL = Sizes(
    SHAPES, [(1, 1328), (5, 18), (129, 463), (64, 64), (300, 2100)], [1, 15, 16, 17, 33, 300, 1328, 4000]
)
TINY = Sizes(TINY_SHAPES, [(1, 40), (5, 18), (33, 33)], [1, 16, 17, 70])


def verdict(err: float, tol: float) -> tuple[str, str]:
    ok = math.isfinite(err) and err <= tol
    return f"max err {err:.2e}", "ok" if ok else "FAIL"


def check_correctness(rep: Report, device: torch.device, dtypes: list[torch.dtype], tiny: bool) -> None:
    from chatsite_kernels.triton import ops

    sizes = TINY if tiny else FULL
    for dtype in dtypes:
        tol = ATOL[dtype]
        for shape in sizes.shapes:
            tag = f"{dtype_name(dtype)} {shape.name}"
            prefill = partial(check_prefill, rep, ops, device, shape, dtype, tol, sizes.prefill_pairs)
            decode = partial(check_decode, rep, ops, device, shape, dtype, tol, sizes.decode_lens)
            rep.guard(SECTION, f"prefill {tag}", prefill)
            rep.guard(SECTION, f"decode {tag}", decode)
        name = dtype_name(dtype)
        rep.guard(
            SECTION, f"store_kv {name}", partial(check_store_kv, rep, ops, device, sizes.shapes[0], dtype)
        )
        rep.guard(SECTION, f"rmsnorm {name}", partial(check_rms_norm, rep, ops, device, dtype))
        rep.guard(SECTION, f"rotary {name}", partial(check_rotary, rep, ops, device, sizes.shapes[:2], dtype))

    if device.type == "cuda":
        rep.guard(SECTION, "decode in a CUDA graph", lambda: check_decode_graph(rep, device))


def check_prefill(
    rep: Report,
    ops: ModuleType,
    device: torch.device,
    shape: Shape,
    dtype: torch.dtype,
    tol: float,
    pairs: list[tuple[int, int]],
) -> None:
    p = make_paged(pairs, shape, dtype, device)
    out = ops.paged_prefill_attention(
        p.query, p.k_cache, p.v_cache, p.block_tables, p.query_start_loc, p.context_lens, p.scale
    )
    ours, status = verdict(max_err(out, attention_ref(p)), tol)
    tag = f"{dtype_name(dtype)} {shape.name}"
    rep.add(Row(SECTION, f"prefill {tag} {pairs}", ours, f"tol {tol:g}", "", status))


def check_decode(
    rep: Report,
    ops: ModuleType,
    device: torch.device,
    shape: Shape,
    dtype: torch.dtype,
    tol: float,
    decode_lens: list[int],
) -> None:
    """Split-K chosen by the launcher, off, and forced to 4 splits."""
    p = make_paged([(1, n) for n in decode_lens], shape, dtype, device, seed=1)
    expected = attention_ref(p)
    tag = f"{dtype_name(dtype)} {shape.name}"
    for splits in (None, 1, 4):
        out = ops.paged_decode_attention(
            p.query, p.k_cache, p.v_cache, p.block_tables, p.context_lens, p.scale, num_splits=splits
        )
        ours, status = verdict(max_err(out, expected), tol)
        name = "auto" if splits is None else splits
        rep.add(Row(SECTION, f"decode {tag} splits={name}", ours, f"tol {tol:g}", "", status))


def check_store_kv(
    rep: Report, ops: ModuleType, device: torch.device, shape: Shape, dtype: torch.dtype
) -> None:
    pool = torch.randn(12, 2, 3, shape.block_size, shape.kv_heads, shape.head_dim).to(device, dtype)
    slots = torch.randperm(12 * shape.block_size)[:50].to(device)
    slots[::7] = -1
    kv = torch.randn(50, 2, shape.kv_heads, shape.head_dim).to(device, dtype)
    expected = pool.clone()
    ref.store_kv_ref(kv[:, 0], kv[:, 1], expected[:, 0, 2], expected[:, 1, 2], slots)
    ops.store_kv(kv[:, 0], kv[:, 1], pool[:, 0, 2], pool[:, 1, 2], slots)
    same = torch.equal(pool, expected)
    ours, status = ("bit-exact", "ok") if same else ("differs", "FAIL")
    rep.add(Row(SECTION, f"store_kv {dtype_name(dtype)}", ours, "", "", status))


def check_rms_norm(rep: Report, ops: ModuleType, device: torch.device, dtype: torch.dtype) -> None:
    for hidden in (576, 2048):
        x = torch.randn(37, hidden, device=device).to(dtype)
        res = torch.randn(37, hidden, device=device).to(dtype)
        w = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
        out, new_res = ops.fused_add_rms_norm(x, res, w, 1e-5)
        ref_out, ref_res = ref.rms_norm_ref(x, w, 1e-5, res)
        # Outputs reach ~4: allow 2 ulps there (accumulation order differs).
        err = max(max_err(out, ref_out), max_err(new_res, ref_res))
        ours, status = verdict(err, 8 * torch.finfo(dtype).eps)
        rep.add(Row(SECTION, f"rmsnorm+add {dtype_name(dtype)} hidden={hidden}", ours, "", "", status))


def check_rotary(
    rep: Report, ops: ModuleType, device: torch.device, shapes: list[Shape], dtype: torch.dtype
) -> None:
    for shape in shapes:
        q_width, kv_width = shape.q_heads * shape.head_dim, shape.kv_heads * shape.head_dim
        qkv = torch.randn(64, q_width + 2 * kv_width, device=device).to(dtype)
        q = qkv[:, :q_width].view(64, shape.q_heads, shape.head_dim)
        k = qkv[:, q_width : q_width + kv_width].view(64, shape.kv_heads, shape.head_dim)
        cache = rope_cache(4096, shape.head_dim, device)
        pos = torch.randint(0, 4096, (64,), device=device)
        rq, rk = ref.rotary_ref(q.clone(), k.clone(), pos, cache)
        ops.rotary_embedding_(q, k, pos, cache)
        ours, status = verdict(max(max_err(q, rq), max_err(k, rk)), 16 * torch.finfo(dtype).eps)
        rep.add(Row(SECTION, f"rotary {dtype_name(dtype)} {shape.name}", ours, "", "", status))


def check_decode_graph(rep: Report, device: torch.device) -> None:
    """Capture one decode call, then replay it on new lengths, tables and queries:
    the launcher must not bake host-side values of those tensors into the graph."""
    from chatsite_kernels.triton import ops

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
            SECTION,
            "decode bf16 captured in a CUDA graph, replayed on new inputs",
            f"max err {err:.2e}",
            f"tol {ATOL[dtype]:g}",
            "",
            "ok" if ok else "FAIL",
        )
    )
