"""Verification rows: one target forward over a sequence's last token and its k
proposed tokens, and the walk that accepts the longest prefix the target agrees with.

**Rows.** Each of the k + 1 positions is packed as its own decode row: the same block
table, its own position and context length. Every attention path stores a step's K/V
before any row attends (the one-call CPU decode stack, the per-op paths, the Triton
kernels), so row j sees the K/V of the positions before it from this same step, which is
causal attention over the proposal. The step stays decode-only, so on the CPU it runs
through the one-call stack: the quantized products' register tiles read each weight once
for all the rows, and decode attention reads the sequence's K/V once for all of them, so
a row adds only its own multiply-adds (about a fifth of a decode step each on the 2-core
CPU, ``benchmarks/bench_spec.py``); each row's logits are bit-identical to decoding that
position alone. On CUDA the step can replay a decode graph.

**Walk.** Position j's token is drawn with the engine's own sampler (penalties, seeds,
logprobs) from the target's logits at j, after the tokens accepted before it were
appended (so penalties and stop rules see exactly the history the engine without
speculation would). It is appended with the ordinary stop rules; the walk continues
while the token equals the proposal. This is rejection sampling (Leviathan et al.,
Chen et al.) for a proposal that is a point mass at token x: accepting with probability
min(1, p(x)/q(x)) = p(x) and otherwise drawing from norm(max(0, p - q)) = p without x is
the same as drawing from p and comparing with x. So every emitted token is distributed
as the target's, greedy output is the target's argmax chain, and a seeded sequence draws
one noise vector per token as it would without speculation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence
from inference.sampling.sampler import Sampler
from inference.sampling.stop_rules import append_token


class VerifyRow:
    """What the model runner reads of a sequence (``token_ids``, ``num_computed_tokens``,
    ``block_table``, ``group_tables``, ``num_tokens``) for one position of a proposal."""

    __slots__ = ("block_table", "group_tables", "num_computed_tokens", "state_slot", "token_ids")
    score_prompt = False  # a proposal's rows never score a prompt (see Sequence.score_prompt)

    def __init__(
        self,
        token_ids: list[int],
        position: int,
        block_table: list[int],
        group_tables: list[list[int]] | None = None,
        state_slot: int = -1,
    ) -> None:
        self.token_ids = token_ids
        self.num_computed_tokens = position
        self.block_table = block_table
        self.group_tables = group_tables if group_tables is not None else []
        self.state_slot = state_slot  # the sequence's recurrent-state slot (a hybrid model's)

    @property
    def num_tokens(self) -> int:
        return self.num_computed_tokens + 1


@dataclass
class Verification:
    seq: Sequence
    draft: list[int]
    logits: torch.Tensor | None = None  # [len(draft) + 1, vocab]
    accepted: int = 0  # proposed tokens the target agreed with
    emitted: int = 0  # tokens appended (accepted + the target's own next token)


@dataclass
class VerifyPlan:
    """The batch the runner executes, and where each verification's rows are in it."""

    run: ScheduledBatch
    verifications: dict[int, Verification] = field(default_factory=dict)  # batch index ->


def expand(batch: ScheduledBatch, drafts: dict[int, list[int]], joined: bool = False) -> VerifyPlan:
    """``batch`` with each row ``i`` of ``drafts`` replaced by its ``len(draft) + 1``
    decode rows (positions p .. p + len(draft)). ``joined`` (a hybrid model): the
    recurrent layers run those rows as one span (``ScheduledBatch.recurrent_spans``)."""
    run = ScheduledBatch(copies=batch.copies, scores_prompt=batch.scores_prompt)
    plan = VerifyPlan(run)
    for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
        draft = drafts.get(i)
        if not draft:
            run.seqs.append(seq)
            run.num_new_tokens.append(n)
            run.recurrent_spans.append(1)
            continue
        plan.verifications[i] = Verification(seq, draft)
        tokens = seq.token_ids + draft
        p = seq.num_computed_tokens
        for j in range(len(draft) + 1):
            row = VerifyRow(tokens, p + j, seq.block_table, seq.group_tables, seq.state_slot)
            run.seqs.append(row)  # type: ignore[arg-type]
            run.num_new_tokens.append(1)
        run.recurrent_spans.append(len(draft) + 1)
    if not joined:
        run.recurrent_spans = []
    return plan


def split_logits(
    plan: VerifyPlan, num_rows: int, logits: torch.Tensor | None, sampled: list[int]
) -> tuple[torch.Tensor | None, list[int]]:
    """Hand each verification its rows of ``logits`` (``sampled`` indexes ``plan.run``);
    return the other rows and their indices into the original batch (``num_rows`` rows)."""
    origin: list[int] = []  # run index -> batch index
    for i in range(num_rows):
        v = plan.verifications.get(i)
        origin += [i] * (len(v.draft) + 1 if v else 1)
    plain_rows: list[int] = []
    plain: list[int] = []
    verify_rows: dict[int, list[int]] = {}
    for row, run_index in enumerate(sampled):
        i = origin[run_index]
        if i in plan.verifications:
            verify_rows.setdefault(i, []).append(row)
        else:
            plain_rows.append(row)
            plain.append(i)
    assert logits is not None or not sampled
    for i, rows in verify_rows.items():
        plan.verifications[i].logits = logits[rows]  # type: ignore[index]
    if not plain:
        return None, []
    if len(plain) == len(sampled):
        return logits, plain
    return logits[plain_rows], plain  # type: ignore[index]


def walk(
    verifications: list[Verification],
    sampler: Sampler,
    eos_token_ids: frozenset[int],
    max_model_len: int,
) -> int:
    """Append each sequence's accepted tokens and the target's next one (see the module
    docstring); returns the tokens appended. Position j of every sequence still going is
    sampled in one call."""
    active = list(verifications)
    j = 0
    appended = 0
    while active:
        seqs = [v.seq for v in active]
        rows = torch.stack([v.logits[j] for v in active])  # type: ignore[index]
        result = sampler(rows, seqs, [s.request.params for s in seqs])  # type: ignore[union-attr]
        still: list[Verification] = []
        for i, (v, token) in enumerate(zip(active, result.token_ids, strict=True)):
            seq = v.seq
            if result.top_logprobs is not None and seq.logprobs is not None:
                seq.cumulative_logprob += result.logprobs[i]  # type: ignore[index]
                seq.logprobs.append(result.top_logprobs[i])  # type: ignore[arg-type]
            append_token(seq, token, eos_token_ids, max_model_len)
            v.emitted += 1
            appended += 1
            if not seq.is_finished and j < len(v.draft) and token == v.draft[j]:
                v.accepted += 1
                still.append(v)
        active = still
        j += 1
    return appended
