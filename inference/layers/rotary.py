"""Rotary position embeddings: the cos/sin tables (default, ``linear``, ``llama3``,
``longrope`` and YaRN scaling, computed as transformers does) and the rotations that
apply them, to the whole head or (partial rotary) to its first features."""

from __future__ import annotations

import math

import torch

from inference.model_config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies ``[rotary_dim/2]`` (fp32), computed as transformers does for
    the default, ``linear`` and ``llama3`` rope types."""
    dim = config.rotary_dim
    # Explicit CPU: the model may be constructed under a `torch.device("meta")` context.
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim)
    )
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    rope_type = scaling["rope_type"]
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling, config.max_position_embeddings)
    raise ValueError(f"rope type {rope_type!r}")  # the config readers already reject these


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict, max_positions: int) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling.get("original_max_position_embeddings", max_positions)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between smoothly blended.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_cos_sin_cache(config: ModelConfig) -> torch.Tensor:
    """``[max_position_embeddings, rotary_dim]`` fp32: cos in the first half, sin in the
    second (the layout ``chatsite_kernels.reference.rotary_ref`` and the Triton kernel take).

    LongRoPE has two tables, stacked: rows ``[0, max)`` with the short factors and
    ``[max, 2 max)`` with the long ones (``longrope_rows`` picks between them)."""
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32, device="cpu")
    scaling = config.rope_scaling
    if scaling is not None and scaling["rope_type"] == "longrope":
        short, long, factor = longrope_inv_freqs(config)
        tables = []
        for inv_freq in (short, long):
            freqs = torch.outer(positions, inv_freq)
            tables.append(torch.cat((freqs.cos() * factor, freqs.sin() * factor), dim=-1))
        return torch.cat(tables)
    freqs = torch.outer(positions, rope_inv_freq(config))
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def longrope_inv_freqs(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(short inverse frequencies, long ones, the cos/sin factor) of LongRoPE (Phi-3),
    as transformers' ``_compute_longrope_parameters`` computes them."""
    scaling = config.rope_scaling or {}
    dim = config.rotary_dim
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or config.max_position_embeddings / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    shape = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    base = config.rope_theta**shape
    short = 1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float32, device="cpu") * base)
    long = 1.0 / (torch.tensor(scaling["long_factor"], dtype=torch.float32, device="cpu") * base)
    return short, long, float(attention_factor)


def longrope_rows(config: ModelConfig, positions: torch.Tensor, ctx_ends: torch.Tensor) -> torch.Tensor:
    """Rows of the stacked LongRoPE table for tokens at ``positions`` whose sequences
    reach ``ctx_ends`` tokens this step: a step of a sequence longer than
    ``original_max_position_embeddings`` rotates all its new tokens with the long
    factors, a shorter one with the short factors, as transformers does for one forward.

    Exact against transformers' ``generate`` for sequences that stay on one side of the
    boundary (prompts that are already longer are prefilled in one step). Where a
    sequence crosses it while decoding, transformers throws its cache away and
    recomputes every key with the long factors; here the keys already cached keep the
    short rotation, so the tokens after the crossing may differ (vLLM does the same).
    A chunked prefill or a prefix-cache hit that straddles the boundary mixes the two
    rotations likewise."""
    original = (config.rope_scaling or {})["original_max_position_embeddings"]
    return positions.long() + (ctx_ends > original).long() * config.max_position_embeddings


def yarn_inv_freq(theta: float, dim: int, scaling: dict, max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN's blended inverse frequencies and its cos/sin factor, as transformers
    computes them (``_compute_yarn_parameters``)."""
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or max_positions
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    ramp = ((torch.arange(dim // 2, device="cpu", dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # high frequencies keep their original speed
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def yarn_cos_sin_cache(config: ModelConfig, dim: int) -> torch.Tensor:
    """``[max_positions, dim]`` fp32 for a rotary part of ``dim`` features: cos (times
    YaRN's factor) then sin; without ``rope_scaling``, the default frequencies."""
    if config.rope_scaling is None:
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim))
        factor = 1.0
    else:
        inv_freq, factor = yarn_inv_freq(
            config.rope_theta, dim, config.rope_scaling, config.max_position_embeddings
        )
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32, device="cpu")
    freqs = torch.outer(positions, inv_freq)
    return torch.cat((freqs.cos() * factor, freqs.sin() * factor), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` ``[T, heads, D]`` with ``cos``/``sin`` ``[T, 1, R/2]`` (fp32).
    ``R < D`` (partial rotary, Phi-3): the first ``R`` features rotate, the rest pass."""
    rotary = 2 * cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """RoPE of ``x`` ``[T, heads, D]``. Interleaved (DeepSeek): pairs (x0, x1), (x2, x3)...
    rotate together; the result is laid out as rotated evens then odds, exactly as
    transformers does it (queries and keys alike, so their dot products are those of
    the interleaved rotation)."""
    if not interleaved:
        return apply_rotary(x, cos, sin)
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
