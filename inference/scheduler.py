"""Continuous batching: which tokens of which sequences run in the next step.

There are no prefill and decode phases (vLLM v1 style). Every sequence has
``num_computed_tokens`` and wants to catch up to ``num_tokens``; one step gives
each, under one token budget, as many tokens as fit: running requests first (a
decode is one token, a long prompt continues its chunk), then waiting requests
in arrival order. A step thus mixes decodes and prefill chunks, new requests
join any step, and finished ones leave at once.

Fair share: requests carry an ``owner`` (a chat user, an API key). Admission from
the waiting queue picks, among the owners with waiting requests, the one holding the
fewest running seats (ties: whose oldest waiting request came first), and admits
that owner's oldest request. One owner with hundreds of queued requests thus gets
every other seat, not all of them, and a chat message waits for a free seat rather
than behind the whole flood. Unowned requests count as one owner; with no owners
at all this is plain arrival order.

When the pool cannot hold the next tokens, the newest running request is
preempted: its blocks are freed (their cached prefixes stay revivable) and it
goes back to the front of the queue to be recomputed. Nothing new is admitted
in a step that preempted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inference.block_manager import BlockManager
from inference.errors import PromptTooLongError
from inference.sequence import Request, RequestStatus, Sequence


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) blocks
    preempted: list[Request] = field(default_factory=list)
    # Requests that cannot grow even with the whole pool to themselves (many beams
    # of a long sequence): they finish with "length" instead of looping forever.
    out_of_memory: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # oldest admission first
        self.num_preemptions = 0

    # ---- requests -------------------------------------------------------------------
    @property
    def prompt_limit(self) -> int:
        """Longest prompt accepted: one position is left for the first generated token,
        and the prompt's K/V must fit the pool."""
        pool_tokens = self.block_manager.num_blocks * self.block_manager.block_size
        return min(self.max_model_len - 1, pool_tokens)

    def check_prompt(self, num_tokens: int) -> None:
        if num_tokens > self.prompt_limit:
            raise PromptTooLongError(num_tokens, self.prompt_limit)
        if num_tokens == 0:
            raise ValueError("prompt must contain at least one token")

    def add(self, request: Request) -> None:
        self.check_prompt(request.num_prompt_tokens)
        width = request.params.width
        if width > min(self.max_num_seqs, self.max_num_batched_tokens):
            raise ValueError(f"n / beam width {width} exceeds max_num_seqs or max_num_batched_tokens")
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish_seq(self, request: Request, seq: Sequence) -> None:
        """A sequence is done: its blocks go back at once."""
        self.block_manager.free(seq)
        request.seqs.remove(seq)
        request.finished_seqs.append(seq)
        if not request.seqs:
            self.retire(request)

    def drop_seq(self, request: Request, seq: Sequence) -> None:
        """A beam that lost: freed and forgotten."""
        self.block_manager.free(seq)
        request.seqs.remove(seq)

    def abort(self, request: Request) -> None:
        for seq in list(request.seqs):
            seq.finish_reason = "abort"
            self.finish_seq(request, seq)
        self.retire(request)

    def retire(self, request: Request) -> None:
        """Take a request out of the queues (its sequences are already freed)."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING and request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED

    # ---- one step -------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            plan = self._plan(request, budget)
            if not plan:
                continue
            if not self._allocate_or_preempt(request, plan, batch):
                break  # ``request`` preempted itself: everything after it is gone too
            self._add_to_batch(batch, plan)
            budget -= sum(n for _, n in plan)

        if not batch.preempted:
            seats = self.max_num_seqs - sum(r.num_seats for r in self.running)
            while self.waiting and budget > 0:
                request = self._next_waiting()
                if request.num_seats > seats:
                    break
                plan = self._admit(request, budget)
                if plan is None and not self.running:
                    # The whole pool is free and it still does not fit (a recomputed
                    # group of long beams): it never will.
                    self.waiting.remove(request)
                    request.status = RequestStatus.FINISHED
                    batch.out_of_memory.append(request)
                    continue
                if plan is None:
                    break  # pool full: wait for running requests to return blocks
                self.waiting.remove(request)
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                seats -= request.num_seats
                self._add_to_batch(batch, plan)
                budget -= sum(n for _, n in plan)
        batch.copies = self.block_manager.take_copies()
        return batch

    def _next_waiting(self) -> Request:
        """The waiting request to admit next: a preempted one first (it held its seat
        already), else the oldest of the owner with the fewest running seats."""
        head = self.waiting[0]
        if head.num_preemptions or all(r.owner is None for r in self.waiting):
            return head
        running: dict[str | None, int] = {}
        for r in self.running:
            running[r.owner] = running.get(r.owner, 0) + r.num_seats
        best: Request | None = None
        best_key: tuple[int, int] | None = None
        seen: set[str | None] = set()
        for position, r in enumerate(self.waiting):  # oldest first, so an owner's first is its oldest
            if r.owner in seen:
                continue
            seen.add(r.owner)
            key = (running.get(r.owner, 0), position)
            if best_key is None or key < best_key:
                best, best_key = r, key
        assert best is not None
        return best

    def finish_step(self, batch: ScheduledBatch) -> None:
        """The model ran: the scheduled tokens are now cached; publish full blocks."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.block_manager.register_full_blocks(seq)

    @staticmethod
    def _add_to_batch(batch: ScheduledBatch, plan: list[tuple[Sequence, int]]) -> None:
        for seq, n in plan:
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)

    def _plan(self, request: Request, budget: int) -> list[tuple[Sequence, int]]:
        """Tokens per sequence of ``request`` within ``budget``.

        The sequences of a forked request (n > 1, beams) are sampled together, so
        after a preemption none of them takes its last token until all can."""
        wants = [(s, s.num_tokens - s.num_computed_tokens) for s in request.seqs]
        if len(wants) == 1:
            seq, want = wants[0]
            n = min(want, budget)
            return [(seq, n)] if n > 0 else []
        if sum(w for _, w in wants) <= budget:
            return wants
        plan = []
        for seq, want in wants:
            n = min(want - 1, budget)
            if n > 0:
                plan.append((seq, n))
                budget -= n
        return plan

    def _allocate_or_preempt(
        self, request: Request, plan: list[tuple[Sequence, int]], batch: ScheduledBatch
    ) -> bool:
        bm = self.block_manager
        while sum(bm.blocks_needed(s, n) for s, n in plan) > bm.num_free_blocks:
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is request:
                return False
        for seq, n in plan:
            ok = bm.allocate_slots(seq, n)
            assert ok, "blocks_needed promised enough free blocks"
        return True

    def _preempt(self, request: Request, batch: ScheduledBatch) -> None:
        self.running.remove(request)
        for seq in request.seqs:
            self.block_manager.free(seq)
            seq.reset_for_recompute()
        if not self.running:
            # It was alone and still did not fit: it never will.
            request.status = RequestStatus.FINISHED
            batch.out_of_memory.append(request)
            return
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        batch.preempted.append(request)

    def _admit(self, request: Request, budget: int) -> list[tuple[Sequence, int]] | None:
        """Give a waiting request its cached prefix and the blocks for its first chunk,
        or change nothing and return None when the pool cannot take it now."""
        bm = self.block_manager
        for seq in request.seqs:
            bm.admit(seq, bm.match_prefix(seq))
        plan = self._plan(request, budget)
        if plan and sum(bm.blocks_needed(s, n) for s, n in plan) <= bm.num_free_blocks:
            for seq, n in plan:
                bm.allocate_slots(seq, n)
            if request.num_preemptions == 0 and not request.forked:
                seq = request.seqs[0]
                request.num_cached_tokens = seq.num_computed_tokens
                bm.record_lookup(seq.num_tokens, seq.num_computed_tokens)
            return plan
        for seq in request.seqs:
            bm.free(seq)
            seq.reset_for_recompute()
        return None
