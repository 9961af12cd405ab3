"""Triton kernel: the gated delta rule of a Gated DeltaNet layer over a packed step,
decode and prefill spans alike, with the states read from and written back to their
slots of the state pool (``chatsite_kernels.gated_delta_reference.gated_delta_varlen``
is the reference and states the layout).

One program per (sequence, value head, block of Dv columns): the block of the head's
``[Dk, Dv]`` state stays in registers while the program walks the sequence's tokens, so
the state is read and written once per step, whatever the number of tokens. Each column
of the state evolves on its own (the rule mixes along Dk only), which is why Dv splits
into independent programs.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from chatsite_kernels.triton.launch import next_pow2


@triton.jit
def _gated_delta_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    out_ptr,
    pool_ptr,
    slots_ptr,
    has_initial_ptr,
    starts_ptr,
    heads,
    dk,
    dv,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    rows = tl.arange(0, BLOCK_K)
    row_ok = rows < dk
    col_ok = cols < dv
    start = tl.load(starts_ptr + seq)
    end = tl.load(starts_ptr + seq + 1)
    if end == start:  # not in this step: its slot stays as it is
        return
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    keep = tl.load(has_initial_ptr + seq) != 0  # False: start from a zero state
    state_ptrs = pool_ptr + (slot * heads + head) * dk * dv + rows[:, None] * dv + cols[None, :]
    tile_ok = row_ok[:, None] & col_ok[None, :]
    state = tl.load(state_ptrs, mask=tile_ok, other=0.0).to(tl.float32)
    state = tl.where(keep, state, 0.0)  # not a product: a recycled slot may hold NaN
    for t in range(start, end):
        row = t * heads + head  # T * H stays far below 2**31
        q = tl.load(q_ptr + row * dk + rows, mask=row_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + row * dk + rows, mask=row_ok, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + row * dv + cols, mask=col_ok, other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + row).to(tl.float32))
        rate = tl.load(beta_ptr + row).to(tl.float32)
        state = state * decay
        remembered = tl.sum(state * k[:, None], axis=0)
        state = state + k[:, None] * ((v - remembered) * rate)[None, :]
        tl.store(out_ptr + row * dv + cols, tl.sum(state * q[:, None], axis=0), mask=col_ok)
    tl.store(state_ptrs, state.to(pool_ptr.dtype.element_ty), mask=tile_ok)


def gated_delta_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_pool: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> torch.Tensor:
    """``q``, ``k`` ``[T, H, Dk]``, ``v`` ``[T, H, Dv]``, ``g``, ``beta`` ``[T, H]``,
    ``ssm_pool`` ``[S, H, Dk, Dv]`` (contiguous, updated in place), ``slots`` ``[B]``
    (distinct), ``has_initial`` ``[B]`` bool, ``query_start_loc`` ``[B+1]``; returns
    ``[T, H, Dv]`` fp32."""
    tokens, heads, dk = q.shape
    dv = v.shape[-1]
    if not ssm_pool.is_contiguous() or tuple(ssm_pool.shape[1:]) != (heads, dk, dv):
        raise ValueError(
            f"ssm_pool must be a contiguous [S, {heads}, {dk}, {dv}], got {tuple(ssm_pool.shape)}"
        )
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    out = torch.empty(tokens, heads, dv, dtype=torch.float32, device=q.device)
    num_seqs = slots.shape[0]
    if num_seqs == 0 or tokens == 0:
        return out
    block_v = min(next_pow2(dv), 32)
    grid = (num_seqs, heads, triton.cdiv(dv, block_v))
    _gated_delta_kernel[grid](
        q,
        k,
        v,
        g,
        beta,
        out,
        ssm_pool,
        slots.to(torch.int64).contiguous(),
        has_initial.to(torch.int32).contiguous(),
        query_start_loc.to(torch.int32).contiguous(),
        heads,
        dk,
        dv,
        BLOCK_K=next_pow2(dk),
        BLOCK_V=block_v,
    )
    return out
