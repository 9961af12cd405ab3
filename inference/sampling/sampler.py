"""Turn a batch of logits into next tokens, each row with its own SamplingParams.

Rows are processed together wherever the rule is a tensor op (temperature,
top-k, top-p, min-p, the draw itself); penalties need each row's token history
and loop over the few rows that ask for them.

Sampling uses the exponential race: ``argmax(p / E)`` with ``E ~ Exp(1)`` per
token draws from ``p`` exactly. Each seeded sequence draws its ``E`` from its
own ``torch.Generator``, one vector per generated token, so its output depends
on its seed only, never on which other requests share the batch.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from chatsite_kernels.cpu import layer_ops as cpu_layer_ops
from inference.engine.sequence import Sequence
from inference.sampling.logit_rules import apply_logit_rules
from inference.sampling.params import SamplingParams


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None = None  # of each sampled token (rows without logprobs: 0.0)
    top_logprobs: list[dict[int, float] | None] | None = None


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0, eos_token_ids: Collection[int] = ()) -> None:
        self.device = device
        self.eos_token_ids = frozenset(eos_token_ids)  # what min_tokens holds back
        # Rows without a seed share this one: deterministic for a fixed workload.
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def make_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence], params: list[SamplingParams]
    ) -> SampleResult:
        logits = logits.float()
        raw = logits
        # logit_bias and min_tokens (a copy: logprobs come from the model's own logits).
        logits = apply_logit_rules(logits, seqs, params, self.eos_token_ids)
        if any(p.has_penalties for p in params):
            logits = logits.clone() if logits is raw else logits
            for i, (seq, p) in enumerate(zip(seqs, params, strict=True)):
                if p.has_penalties:
                    apply_penalties(logits[i], seq, p)

        greedy = [p.greedy for p in params]
        if all(greedy):
            tokens = greedy_tokens(logits)
        else:
            tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
            rows = [i for i, g in enumerate(greedy) if not g]
            if len(rows) < len(params):
                greedy_rows = torch.tensor([i for i, g in enumerate(greedy) if g], device=logits.device)
                tokens[greedy_rows] = greedy_tokens(logits[greedy_rows])
            sampled = self._sample(logits[rows], [seqs[i] for i in rows], [params[i] for i in rows])
            tokens[torch.tensor(rows, device=logits.device)] = sampled

        token_list = tokens.tolist()
        result = SampleResult(token_list)
        if any(p.logprobs is not None for p in params):
            result.logprobs, result.top_logprobs = _logprobs(raw, tokens, params)
        return result

    def _sample(
        self, logits: torch.Tensor, seqs: list[Sequence], params: list[SamplingParams]
    ) -> torch.Tensor:
        device = logits.device
        temps = torch.tensor([p.temperature for p in params], device=device)
        logits = logits / temps[:, None]
        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        if any(p < 1.0 for p in top_p):
            logits = _top_k_top_p_sorted(logits, top_k, top_p)
        elif any(k > 0 for k in top_k):
            logits = _top_k(logits, top_k)
        if any(p.min_p > 0 for p in params):
            probs = logits.softmax(dim=-1)
            min_p = torch.tensor([p.min_p for p in params], device=device)
            threshold = min_p[:, None] * probs.amax(dim=-1, keepdim=True)
            logits = logits.masked_fill(probs < threshold, float("-inf"))
        probs = logits.softmax(dim=-1)

        noise = torch.empty_like(probs)
        unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
        for i, seq in enumerate(seqs):
            if seq.generator is not None:
                noise[i].exponential_(generator=seq.generator)
        if unseeded:
            idx = torch.tensor(unseeded, device=device)
            noise[idx] = torch.empty(len(unseeded), probs.shape[1], device=device).exponential_(
                generator=self.generator
            )
        return (probs / noise).argmax(dim=-1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)``; on the CPU through a C kernel (torch's argmax over a
    49k vocabulary runs on one core at a few GB/s, a few ms per batch-64 step)."""
    if cpu_layer_ops.is_cpu_f32(logits) and logits.dim() == 2 and cpu_layer_ops.available():
        return cpu_layer_ops.argmax_rows(logits)
    return logits.argmax(dim=-1)


def apply_penalties(row: torch.Tensor, seq: Sequence, params: SamplingParams) -> None:
    """vLLM/OpenAI semantics, in place on one row of logits: repetition over prompt and
    output tokens (divide positive logits, multiply negative ones), presence and
    frequency over output tokens only."""
    vocab = row.shape[0]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(seq.token_ids, device=row.device).unique()
        seen = seen[seen < vocab]
        values = row[seen]
        rp = params.repetition_penalty
        row[seen] = torch.where(values > 0, values / rp, values * rp)
    if (params.presence_penalty or params.frequency_penalty) and seq.num_output_tokens:
        out = torch.tensor(seq.output_token_ids, device=row.device)
        counts = torch.bincount(out[out < vocab], minlength=vocab).to(row.dtype)
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(row.dtype)


def _top_k(logits: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """Keep each row's ``k`` largest logits (k = 0 keeps all)."""
    vocab = logits.shape[1]
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=logits.device)
    kmax = int(ks.max())
    kth = logits.topk(kmax, dim=-1).values.gather(1, (ks - 1)[:, None])
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_k_top_p_sorted(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Top-k then top-p (nucleus: the smallest set whose probability reaches p; the
    most likely token always stays) on one descending sort per row."""
    vocab = logits.shape[1]
    device = logits.device
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=device)
    ps = torch.tensor(top_p, device=device)
    values, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)[None, :]
    values = values.masked_fill(ranks >= ks[:, None], float("-inf"))
    probs = values.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability mass strictly above each token
    values = values.masked_fill(before > ps[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, values)


def _logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]
) -> tuple[list[float], list[dict[int, float] | None]]:
    """Log-probabilities under the model's own distribution (before temperature and
    filtering, as vLLM reports them): the sampled token's and the top ``logprobs``."""
    logp = raw.log_softmax(dim=-1)
    chosen = logp.gather(1, tokens[:, None]).squeeze(1).tolist()
    k = max(p.logprobs or 0 for p in params)
    top_vals, top_ids = logp.topk(k, dim=-1) if k else (None, None)
    tops: list[dict[int, float] | None] = []
    for i, p in enumerate(params):
        if p.logprobs is None:
            tops.append(None)
            continue
        entry = {int(tokens[i]): chosen[i]}
        if p.logprobs and top_ids is not None:
            entry.update(
                zip(top_ids[i, : p.logprobs].tolist(), top_vals[i, : p.logprobs].tolist(), strict=True)
            )
        tops.append(entry)
    return chosen, tops
