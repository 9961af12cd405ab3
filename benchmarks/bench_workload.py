"""Benchmark part (used by ``benchmarks.bench``): the throughput workload and the
machine's limits. Builds the 64-request chat workload, counts the matmul FLOPs it needs
at minimum, and measures this machine's fp32 matmul rate and memory bandwidth, which
turn those FLOPs and the weight bytes into tokens/s bounds.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import torch

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part river mountain garden kitchen engine market science music history planet ocean"
).split()


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def chat_prompt(tokenizer: Any, rng: random.Random, target_len: int) -> list[int]:
    """A one-message chat prompt of about ``target_len`` tokens (never fewer)."""
    words: list[str] = []
    ids = tokenizer.encode_chat([{"role": "user", "content": "Summarise:"}])
    while len(ids) < target_len:
        words += [rng.choice(WORDS) for _ in range(max(1, (target_len - len(ids)) // 2))]
        ids = tokenizer.encode_chat([{"role": "user", "content": "Summarise: " + " ".join(words)}])
    return ids


def make_throughput_workload(tokenizer: Any, num_requests: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    prompts = [chat_prompt(tokenizer, rng, rng.randint(20, 400)) for _ in range(num_requests)]
    return Workload(prompts, [rng.randint(16, 256) for _ in range(num_requests)])


# ---- machine limits ---------------------------------------------------------------------


def measure_matmul_flops(hidden: int, intermediate: int, rows: int) -> float:
    """Best fp32 GEMM rate over a square 1024^3 and the model's MLP shape at ``rows``
    tokens, through torch's BLAS and through our packed C kernel (whichever is faster
    is the machine's limit as far as this engine can know)."""
    from chatsite_kernels.cpu import linear as cpu_linear  # noqa: PLC0415 - only the CPU benchmark needs it

    best = 0.0
    for m, k, n in ((1024, 1024, 1024), (rows, hidden, intermediate)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        products = [lambda a=a, b=b: a @ b]
        if cpu_linear.available():
            packed = cpu_linear.pack_weight(b.t().contiguous())
            products.append(lambda a=a, packed=packed, n=n: cpu_linear.linear_packed(a, packed, n))
        for product in products:
            for _ in range(3):
                product()
            reps, start = 0, time.perf_counter()
            while time.perf_counter() - start < 1.0:
                product()
                reps += 1
            best = max(best, 2 * m * k * n * reps / (time.perf_counter() - start))
    return best


def measure_bandwidth() -> float:
    """Bytes/s of a large copy (read + write), like streaming the weights once per step."""
    src = torch.randn(64 * 2**20)  # 256 MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        dst.copy_(src)
        reps += 1
    return 2 * src.numel() * 4 * reps / (time.perf_counter() - start)


def workload_flops(mc: Any, workload: Workload) -> float:
    """Matmul FLOPs the workload needs at minimum: every prompt and output token through
    every linear layer, attention scores and values over its context, and the LM head
    once per output token (only sampled positions need logits)."""
    h, inter, layers = mc.hidden_size, mc.intermediate_size, mc.num_layers
    q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    per_token_linear = 2 * layers * (h * q + 2 * h * kv + q * h + 3 * h * inter)
    if getattr(mc, "mla", None) is not None:
        per_token_linear, q = _mla_moe_linear_flops(mc), mc.num_heads * mc.mla.latent_dim
    total = 0.0
    for prompt, out in zip(workload.prompts, workload.output_lens, strict=True):
        tokens = len(prompt) + out - 1  # the last sampled token is never fed back
        total += tokens * per_token_linear + out * 2 * h * mc.vocab_size
        context_sum = tokens * (tokens + 1) / 2  # token i attends to i + 1 keys
        total += 2 * 2 * layers * q * context_sum
    return total


def _mla_moe_linear_flops(mc: Any) -> float:
    """Per-token linear FLOPs of an MLA + MoE model as we run decode: the query (LoRA'd or
    not), the latent projection, the absorbed ``W_UK``/``W_UV`` products, the output
    projection, and the MLP (dense layers whole; MoE layers their router, the ``top_k``
    chosen experts and the shared ones)."""
    mla, moe, h, heads = mc.mla, mc.moe, mc.hidden_size, mc.num_heads
    q_out = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    q = h * q_out if mla.q_lora_rank is None else mla.q_lora_rank * (h + q_out)
    attn = q + h * mla.latent_dim + heads * mla.kv_lora_rank * (mla.qk_nope_head_dim + mla.v_head_dim)
    attn += heads * mla.v_head_dim * h
    dense_layers = moe.first_dense_layers if moe is not None else mc.num_layers
    moe_mlp = 0
    if moe is not None:
        moe_mlp = h * moe.num_experts + 3 * h * moe.intermediate_size * (moe.top_k + moe.num_shared_experts)
    mlp = dense_layers * 3 * h * mc.intermediate_size + (mc.num_layers - dense_layers) * moe_mlp
    return 2 * (mc.num_layers * attn + mlp)
