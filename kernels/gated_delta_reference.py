"""Plain PyTorch references of a Gated DeltaNet layer's two stateful parts: the short
causal convolution and the gated delta rule. They are the engine's path where no kernel
serves, and the oracle the C and Triton kernels are tested against.

Packed, variable-length layout (as ``AttentionContext.query_start_loc`` packs a step):
sequence ``b`` owns rows ``[query_start_loc[b], query_start_loc[b+1])`` of every ``[T, ...]``
input, and its states live in slot ``slots[b]`` of the state pools, read (zeros instead
where ``has_initial[b]`` is False) and overwritten in place with the state after its last
row.

    conv pool:  [num_slots, C, K-1]  the last K-1 inputs of the convolution
    ssm pool:   [num_slots, H, Dk, Dv] fp32, the recurrent matrix of each value head

The delta rule takes ``q`` and ``k`` already L2-normalised (``q`` also scaled by
``Dk ** -0.5``) and repeated to the value heads; per token and head, with ``S`` the state:

    S <- exp(g) * S;   S <- S + k (beta (v - S^T k))^T;   out = S^T q
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension (the FLA library's form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _spans(query_start_loc: torch.Tensor) -> list[tuple[int, int]]:
    starts = query_start_loc.tolist()
    return list(zip(starts[:-1], starts[1:], strict=True))


def _initial(pool: torch.Tensor, slots: torch.Tensor, has_initial: torch.Tensor) -> torch.Tensor:
    """The sequences' states gathered from the pool, zeros where there is none yet."""
    states = pool.index_select(0, slots.long())
    # where, not a product: a recycled slot may hold anything, NaN included.
    return torch.where(has_initial.view(-1, *([1] * (states.dim() - 1))), states, 0.0)


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_pool: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> torch.Tensor:
    """SiLU of the depthwise causal convolution of ``x`` ``[T, C]`` with ``weight``
    ``[C, K]``, each sequence continuing from its saved last ``K-1`` inputs; returns
    ``[T, C]`` and leaves each sequence's last ``K-1`` inputs in its slot."""
    width = weight.shape[1] - 1
    spans = _spans(query_start_loc)
    initial = _initial(conv_pool, slots, has_initial).to(x.dtype)  # [B, C, K-1]
    if all(end - start == 1 for start, end in spans):  # decode: one token each, all at once
        window = torch.cat((initial, x.unsqueeze(-1)), dim=-1)  # [B, C, K]
        out = (window * weight).sum(-1)
        conv_pool[slots.long()] = window[..., 1:].to(conv_pool.dtype)
        return F.silu(out)
    out = torch.empty_like(x)
    for b, (start, end) in enumerate(spans):
        if end == start:
            continue
        window = torch.cat((initial[b], x[start:end].t()), dim=-1)  # [C, K-1+L]
        out[start:end] = F.conv1d(window[None], weight[:, None, :], groups=weight.shape[0])[0].t()
        conv_pool[int(slots[b])] = window[:, window.shape[1] - width :].to(conv_pool.dtype)
    return F.silu(out)


def gated_delta_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """One token of each of ``B`` sequences: ``q``, ``k`` ``[B, H, Dk]``, ``v`` ``[B, H, Dv]``,
    ``g``, ``beta`` ``[B, H]``, fp32 ``state`` ``[B, H, Dk, Dv]`` (updated in place);
    returns ``[B, H, Dv]`` fp32."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    state.mul_(g.exp()[..., None, None])
    remembered = (state * k.unsqueeze(-1)).sum(dim=-2)  # S^T k: [B, H, Dv]
    delta = (v - remembered) * beta.unsqueeze(-1)
    state.add_(k.unsqueeze(-1) * delta.unsqueeze(-2))
    return (state * q.unsqueeze(-1)).sum(dim=-2)


def gated_delta_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule over ``L`` tokens of one sequence in chunks: ``q``, ``k`` ``[L, H, Dk]``,
    ``v`` ``[L, H, Dv]``, ``g``, ``beta`` ``[L, H]``, ``state`` ``[H, Dk, Dv]``; returns
    (``[L, H, Dv]``, the state after the last token), both fp32.

    Within a chunk the delta updates form a unit lower-triangular system (the WY / UT
    form) solved once, so the sequential scan runs over chunks, not tokens. Padding the
    last chunk with ``beta = 0`` and ``g = 0`` leaves the state as it was."""
    length, heads, dk = k.shape
    dv = v.shape[-1]
    pad = (-length) % chunk_size
    q, k, v = (F.pad(t.float().transpose(0, 1), (0, 0, 0, pad)) for t in (q, k, v))  # [H, L', D]
    g, beta = (F.pad(t.float().t(), (0, pad)) for t in (g, beta))  # [H, L']
    chunks = (length + pad) // chunk_size
    q, k, v = (t.reshape(heads, chunks, chunk_size, -1) for t in (q, k, v))
    beta = beta.reshape(heads, chunks, chunk_size, 1)
    decay = g.reshape(heads, chunks, chunk_size).cumsum(dim=-1)  # log of the decay since the chunk began
    future = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    pair_decay = (decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(future, float("-inf")).exp()
    k_beta = k * beta
    system = (k_beta @ k.transpose(-1, -2)) * pair_decay
    values = torch.linalg.solve_triangular(system, v * beta, upper=False, unitriangular=True)
    reads = torch.linalg.solve_triangular(
        system, k_beta * decay.exp().unsqueeze(-1), upper=False, unitriangular=True
    )
    inner = (q @ k.transpose(-1, -2)) * pair_decay
    q_decayed = q * decay.exp().unsqueeze(-1)
    k_to_end = k * (decay[..., -1:] - decay).exp().unsqueeze(-1)
    chunk_decay = decay[..., -1].exp()[..., None, None]  # [H, n, 1, 1]
    s = state.float().clone()
    out = torch.empty(heads, chunks, chunk_size, dv, dtype=torch.float32, device=q.device)
    for c in range(chunks):
        corrected = values[:, c] - reads[:, c] @ s  # what the state does not predict yet
        out[:, c] = q_decayed[:, c] @ s + inner[:, c] @ corrected
        s = s * chunk_decay[:, c] + k_to_end[:, c].transpose(-1, -2) @ corrected
    out = out.reshape(heads, -1, dv)[:, :length].transpose(0, 1)
    return out, s


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
    """The rule over a packed step (module docstring): ``q``, ``k`` ``[T, H, Dk]``, ``v``
    ``[T, H, Dv]``, ``g``, ``beta`` ``[T, H]``; returns ``[T, H, Dv]`` fp32. Decode steps run
    the recurrent form for every sequence at once, longer spans the chunked form."""
    spans = _spans(query_start_loc)
    initial = _initial(ssm_pool, slots, has_initial).float()
    if all(end - start == 1 for start, end in spans):
        out = gated_delta_recurrent(q, k, v, g, beta, initial)
        ssm_pool[slots.long()] = initial.to(ssm_pool.dtype)
        return out
    out = torch.empty(*v.shape, dtype=torch.float32, device=v.device)
    for b, (start, end) in enumerate(spans):
        if end == start:
            continue
        rows = slice(start, end)
        if end - start == 1:
            state = initial[b : b + 1]
            out[rows] = gated_delta_recurrent(q[rows], k[rows], v[rows], g[rows], beta[rows], state)
            state = state[0]
        else:
            out[rows], state = gated_delta_chunked(q[rows], k[rows], v[rows], g[rows], beta[rows], initial[b])
        ssm_pool[int(slots[b])] = state.to(ssm_pool.dtype)
    return out
