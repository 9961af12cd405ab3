"""The engine's speculative-decoding step: propose, verify inside the batch, accept.

``LLMEngine.step`` calls, around its one forward pass:

1. ``propose(batch)`` after scheduling: every decoding row (one new token, a request
   of width 1, its sequence not paused by the adaptive policy) asks the proposer for up
   to k tokens, within the step's token budget, ``max_tokens`` and the context; the
   block manager gives the extra positions their slots. Returns the batch to execute,
   with those rows expanded into verify rows (``inference.spec.verify``). Prefill
   chunks and other decodes run beside them unchanged.
2. ``split(batch, logits, sampled)`` after the forward pass: the verify rows' logits go
   aside; the rest are sampled by the engine as always.
3. ``accept(...)`` in the engine's sampling: the walk appends the accepted tokens and
   the target's next one; the accepted positions count as computed (and full blocks are
   published to the prefix cache); the blocks of rejected positions are released.

``NoSpeculation`` is the same interface doing nothing, so the engine has no branches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Request, Sequence
from inference.kv.block_manager import BlockManager
from inference.sampling.sampler import Sampler
from inference.spec.adaptive import AdaptivePolicy
from inference.spec.ngram import NgramProposer
from inference.spec.verify import Verification, VerifyPlan, expand, split_logits, walk


class Proposer(Protocol):
    def propose_batch(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]: ...

    def verified(self, seq: Sequence, draft: list[int], accepted: int) -> None: ...


class NgramBatchProposer(NgramProposer):
    def propose_batch(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        return [self.propose(seq, limit) for seq, limit in zip(seqs, limits, strict=True)]

    def verified(self, seq: Sequence, draft: list[int], accepted: int) -> None:
        pass


@dataclass
class SpecStats:
    verify_steps: int = 0  # steps with at least one verification
    verifications: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0  # tokens appended by verifications (accepted + one each)
    rollbacks: int = 0  # verifications whose recurrent state went back (a hybrid model's)

    @property
    def rejected_tokens(self) -> int:
        return self.proposed_tokens - self.accepted_tokens

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else 0.0


class NoSpeculation:
    stats = SpecStats()
    pending: list[Verification] = []  # noqa: RUF012 - never changed: always empty here

    def propose(self, batch: ScheduledBatch) -> ScheduledBatch:
        return batch

    def split(
        self, batch: ScheduledBatch, logits: torch.Tensor | None, sampled: list[int]
    ) -> tuple[torch.Tensor | None, list[int]]:
        return logits, sampled

    def pending_groups(self) -> dict[Request, list[int]]:
        """The engine's sampling groups (request -> rows) to start from: the verified
        sequences' requests, with no rows (their tokens come from ``accept``)."""
        return {v.seq.request: [] for v in self.pending}  # type: ignore[misc]

    def accept(self) -> int:
        return 0


class Speculator(NoSpeculation):
    joins_rows = False  # the recurrent layers run a verification's rows as one span (expand)

    def __init__(
        self,
        proposer: Proposer,
        block_manager: BlockManager,
        sampler: Sampler,
        *,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        max_num_batched_tokens: int,
        policy: AdaptivePolicy,
    ) -> None:
        self.proposer = proposer
        self.block_manager = block_manager
        self.sampler = sampler
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.stats = SpecStats()
        self._plan: VerifyPlan | None = None
        self.pending: list[Verification] = []

    def _limit(self, seq: Sequence) -> int:
        """Proposed tokens that could still be emitted: a step appends up to k + 1."""
        params = seq.request.params  # type: ignore[union-attr]
        room = self.max_model_len - seq.num_tokens - 1
        if params.max_tokens is not None:
            room = min(room, params.max_tokens - seq.num_output_tokens - 1)
        return room

    def _candidates(self, batch: ScheduledBatch) -> list[int]:
        rows = []
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            params = seq.request.params  # type: ignore[union-attr]
            if (
                n == 1
                and seq.num_computed_tokens + 1 == seq.num_tokens
                and params.width == 1
                and not params.use_beam_search
                # The accepting walk samples without grammar masks: constrained rows decode plainly.
                and seq.grammar is None
                and self.policy.allows(seq)
            ):
                rows.append(i)
        return rows

    def propose(self, batch: ScheduledBatch) -> ScheduledBatch:
        self.policy.step += 1
        self._plan = None
        decoding = sum(1 for n in batch.num_new_tokens if n == 1)
        rows = self._candidates(batch) if self.policy.batch_allows(decoding) else []
        limits = [min(self._limit(batch.seqs[i]), self.policy.draft_length(batch.seqs[i])) for i in rows]
        rows, limits = (
            [i for i, lim in zip(rows, limits, strict=True) if lim > 0],
            [x for x in limits if x > 0],
        )
        if not rows:
            return batch
        drafts = self.proposer.propose_batch([batch.seqs[i] for i in rows], limits)
        budget = self.max_num_batched_tokens - batch.num_tokens
        chosen: dict[int, list[int]] = {}
        bm = self.block_manager
        for i, draft in zip(rows, drafts, strict=True):
            draft = draft[: max(0, budget)]
            seq = batch.seqs[i]
            if not draft or not self._hold(seq):
                continue
            while draft and not bm.allocate_slots(seq, 1 + len(draft)):
                draft = draft[:-1]  # the pool is short: propose less
            if draft:
                chosen[i] = draft
                budget -= len(draft)
            else:
                self._unhold(seq)
        if not chosen:
            return batch
        self._plan = expand(batch, chosen, joined=self.joins_rows)
        return self._plan.run

    def _hold(self, seq: Sequence) -> bool:
        """Get ready to verify a proposal of ``seq`` (False: it decodes plainly this step)."""
        return True

    def _unhold(self, seq: Sequence) -> None:
        """``_hold`` came to nothing: no proposal of ``seq`` runs this step."""

    def split(
        self, batch: ScheduledBatch, logits: torch.Tensor | None, sampled: list[int]
    ) -> tuple[torch.Tensor | None, list[int]]:
        """The rows the engine samples as always; the verifications wait in ``pending``."""
        plan, self._plan = self._plan, None
        if plan is None:
            return logits, sampled
        logits, plain = split_logits(plan, len(batch.seqs), logits, sampled)
        self.pending = list(plan.verifications.values())
        return logits, plain

    def accept(self) -> int:
        verifications, self.pending = self.pending, []
        if not verifications:
            return 0
        appended = walk(verifications, self.sampler, self.eos_token_ids, self.max_model_len)
        stats = self.stats
        stats.verify_steps += 1
        for v in verifications:
            seq = v.seq
            self._settle(v)
            self.proposer.verified(seq, v.draft, v.accepted)
            self.policy.observe(seq, len(v.draft), v.accepted)
            stats.verifications += 1
            stats.proposed_tokens += len(v.draft)
            stats.accepted_tokens += v.accepted
            stats.emitted_tokens += v.emitted
        return appended

    def _settle(self, v: Verification) -> None:
        """The scheduler counted the sequence's last token as computed; the accepted
        proposal's positions hold valid K/V too, the rest is released."""
        seq, bm = v.seq, self.block_manager
        seq.num_computed_tokens += v.accepted
        bm.register_full_blocks(seq)
        bm.truncate(seq, seq.num_computed_tokens)
