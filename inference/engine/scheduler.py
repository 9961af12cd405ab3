"""Continuous batching: which tokens of which sequences run in the next step.

There are no prefill and decode phases (vLLM v1 style). Every sequence has
``num_computed_tokens`` and wants to catch up to ``num_tokens``; one step gives
each, under one token budget, as many tokens as fit: the running decodes first, then
the running prompt chunks with the fewest uncached tokens first (``prompt_order``),
then waiting requests (which, once the step's prompt time is spent, take their seat
and cached prefix and compete from the next step). Steps mix decodes and prompt chunks.

Fair share: requests carry an ``owner`` (a chat user, an API key) and a ``weight``
(1 by default; the site sets it from the owner's groups). Admission from the waiting
queue picks, among the owners with waiting requests, the one holding the fewest running
seats per unit of weight (ties: whose oldest waiting request came first), and admits
that owner's oldest request. Two busy owners of weights 1 and 3 thus hold seats (and
get tokens) one to three. One owner with hundreds of queued requests gets
every other seat, not all of them, and a chat message waits for a free seat rather
than behind the whole flood. Unowned requests count as one owner; with no owners
at all this is plain arrival order.

When the pool cannot hold the next tokens, a running request is preempted: its
blocks are freed (their cached prefixes stay revivable) and it goes back to the
front of the queue. Nothing new is admitted in a step that preempted.

- **Victim.** The running request preempted the fewest times so far, the newest
  among those, and never one already given tokens in this step. A request that
  comes back after a preemption is thus not the next victim again while others
  have been preempted less (no thrashing).
- **Swap or recompute** (with lower KV tiers): the victim's full blocks are swapped
  out (written down where no tier has them yet, read back at re-admission) when the
  tiers' cost model says moving their bytes is faster than recomputing their tokens
  (``TierStack.swap_out``); otherwise it is recomputed.
- **Loading KV.** A waiting request whose prefix continues in a lower tier, where the
  tiers say reading beats recomputing (``BlockManager.prefix_to_load``), gets fresh
  pool blocks for it and waits in ``loading`` (state ``LOADING_KV``, holding a seat)
  while the reads run; the other requests keep stepping. When the reads are done it
  joins the running requests with those blocks computed, and its prefill covers only
  what no tier had.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any

from inference.engine.prompt_order import fewest_uncached_first, room_for_prompt, wants_prompt_chunk
from inference.engine.scheduled_batch import ScheduledBatch as ScheduledBatch  # re-exported
from inference.engine.sequence import Request, RequestStatus, Sequence
from inference.engine.step_budget import PromptAllowance, StepBudget, count_tokens
from inference.errors import PromptTooLongError
from inference.kv.block_manager import BlockManager


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        *,
        step_budget: StepBudget | None = None,
    ) -> None:
        """``block_manager`` hands out the pool's blocks (and reaches the tiers below it);
        ``step_budget`` sizes prompt chunks to a step time while streams decode (None: full
        chunks). Both are the scheduler's for its lifetime."""
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # oldest admission first
        self.loading: list[Request] = []  # reading KV blocks from a lower tier
        self.num_preemptions = 0
        self.num_swaps = 0
        self.step_budget = step_budget
        # Seats held outside the running requests, per owner (an embedding job in progress:
        # ``inference.engine.embedding_jobs``): counted in the fair share at admission.
        self.external_seats: dict[str | None, int] = {}
        # LoRA adapters one batch may hold (the engine's resident-adapter cap; None: no
        # adapters): a request of one more adapter waits for a running adapter to finish.
        self.max_loras: int | None = None

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
        return bool(self.waiting or self.running or self.loading)

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
        elif request.status is RequestStatus.LOADING_KV:
            self.loading.remove(request)
        elif request.status is RequestStatus.WAITING and request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED

    # ---- hooks for a scheduler with prefill workers (inference.pd) ---------------------
    def close(self) -> None:
        """Stop what the scheduler started (prefill workers)."""

    def purge_namespace(self, namespace: int) -> None:
        """Caches the scheduler keeps beyond the block manager (prefill workers') drop
        ``namespace``'s blocks."""

    def disaggregation_stats(self) -> dict[str, Any]:
        return {}

    # ---- one step -------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        self._finish_loading()
        if self.step_budget is not None:
            self.step_budget.start()
        # Made for this step and dropped with it; the decoding requests are counted at the
        # step's first prompt chunk (a step of decodes never needs the pass).
        allowance = PromptAllowance(self._prefill_limit)
        scheduled: set[int] = set()  # ids of requests given tokens in this step
        prompts: list[Request] = []  # running requests with prompt tokens left
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if budget > 0 and self._decode_in_place(request, batch):
                scheduled.add(id(request))
                budget -= 1
            elif wants_prompt_chunk(request):
                prompts.append(request)
            else:
                budget -= self._schedule_running(request, budget, allowance, batch, scheduled)
        # Then the prompt chunks: a new turn after a cached history before long first prompts.
        for request in fewest_uncached_first(prompts):
            if request.status is RequestStatus.RUNNING:
                budget -= self._schedule_running(request, budget, allowance, batch, scheduled)
        if not batch.preempted and self.waiting:
            self._admit_waiting(batch, budget, allowance)
        batch.copies = self.block_manager.take_copies()
        return batch

    def _schedule_running(
        self,
        request: Request,
        budget: int,
        allowance: PromptAllowance,
        batch: ScheduledBatch,
        scheduled: set[int],
    ) -> int:
        """Plan a running request's tokens (a decode that needs a block, or a prompt chunk),
        preempting others when the pool is short; the step's tokens it took."""
        plan = self._plan(request, budget, allowance)
        if not plan or not self._allocate_or_preempt(request, plan, batch, scheduled):
            return 0  # nothing fits, or ``request`` preempted itself
        scheduled.add(id(request))
        self._add_to_batch(batch, plan, allowance)
        return sum(n for _, n in plan)

    def _admit_waiting(self, batch: ScheduledBatch, budget: int, allowance: PromptAllowance) -> None:
        """Admissions (the seat count is a pass over running) in fair-share order."""
        seats = self.max_num_seqs - sum(r.num_seats for r in self.running + self.loading)
        compiling = self._hold_compiling()
        # Running seats per owner, kept up to date through this step's admissions
        # (recounting them for every admission made a burst of arrivals quadratic).
        owner_seats: dict[str | None, int] = {}
        num_owners = len({r.owner for r in self.waiting})  # an upper bound once some are admitted
        for r in self.running + self.loading:
            owner_seats[r.owner] = owner_seats.get(r.owner, 0) + r.num_seats
        for owner, n in self.external_seats.items():
            owner_seats[owner] = owner_seats.get(owner, 0) + n
        adapters = {r.adapter for r in self.running + self.loading if r.adapter is not None}
        while self.waiting and budget > 0:
            request = self._next_waiting(owner_seats, num_owners)
            if request.num_seats > seats:
                break
            if request.adapter is not None and request.adapter not in adapters:
                if self.max_loras is not None and len(adapters) >= self.max_loras:
                    break  # its adapter would be one more than a batch can hold: later
                adapters.add(request.adapter)
            loading = self._start_loading(request)
            if loading is None:
                break  # its blocks are below the pool: wait for room to load them
            if not loading:
                plan = self._admit(request, budget, allowance)
                if plan is None and not self.running and not self.loading:
                    # The whole pool is free and it still does not fit (a recomputed
                    # group of long beams): it never will.
                    self.waiting.remove(request)
                    request.status = RequestStatus.FINISHED
                    batch.out_of_memory.append(request)
                    continue
                if plan is None:
                    break  # pool full: wait for running requests to return blocks
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                self._add_to_batch(batch, plan, allowance)
                budget -= sum(n for _, n in plan)
            self.waiting.remove(request)
            seats -= request.num_seats
            owner_seats[request.owner] = owner_seats.get(request.owner, 0) + request.num_seats
        self.waiting.extendleft(reversed(compiling))

    def prompt_allowance(self) -> int | None:
        """Prompt tokens a step may take now under the time budget (None: no limit, nobody
        decodes); other prefill-like work (embeddings) is sized by it too."""
        return self._prefill_limit()

    def _prefill_limit(self) -> int | None:
        """Worked out at the step's first prompt chunk: the requests decoding then (one
        preempted earlier in the step, to be recomputed, no longer counts)."""
        if self.step_budget is None:
            return None
        decoding = 0
        for r in self.running:
            seqs = r.seqs
            if len(seqs) == 1:  # the usual request, without a generator per request
                decoding += len(seqs[0].token_ids) - seqs[0].num_computed_tokens <= 1
            else:
                decoding += all(s.num_tokens - s.num_computed_tokens <= 1 for s in seqs)
        return self.step_budget.prefill_limit(decoding)

    def _hold_compiling(self) -> list[Request]:
        """Take the requests whose grammar is still compiling out of the queue for this
        step (they go back in front afterwards), so the others are admitted past them."""
        compiling = [r for r in self.waiting if r.grammar_pending]
        for request in compiling:
            self.waiting.remove(request)
        return compiling

    def _next_waiting(self, owner_seats: dict[str | None, int], num_owners: int) -> Request:
        """The waiting request to admit next: a preempted one first (it held its seat
        already), else the oldest of the owner with the fewest running seats
        (``owner_seats``: running and loading seats per owner; ``num_owners``: at least
        the number of owners waiting, so the scan stops once it has met them all)."""
        head = self.waiting[0]
        if head.num_preemptions or all(r.owner is None for r in self.waiting):
            return head
        best: Request | None = None
        best_key: tuple[float, int] | None = None
        seen: set[str | None] = set()
        for position, r in enumerate(self.waiting):  # oldest first, so an owner's first is its oldest
            if r.owner in seen:
                continue
            seen.add(r.owner)
            # Seats per unit of weight: an owner of weight 3 is served as three of weight 1.
            key = (owner_seats.get(r.owner, 0) / r.weight, position)
            if best_key is None or key < best_key:
                best, best_key = r, key
                if key[0] == 0:  # no later owner can beat an idle one that waited longer
                    break
            if len(seen) == num_owners:
                break
        assert best is not None
        return best

    def finish_step(self, batch: ScheduledBatch) -> None:
        """The model ran: the scheduled tokens are now cached; publish full blocks."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.block_manager.register_full_blocks(seq)
        if self.step_budget is not None:
            self.step_budget.observe(*count_tokens(batch.num_new_tokens))

    def _add_to_batch(
        self, batch: ScheduledBatch, plan: list[tuple[Sequence, int]], allowance: PromptAllowance
    ) -> None:
        for seq, n in plan:
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            allowance.spend(n)
            if seq.score_prompt:
                batch.scores_prompt = True

    def _decode_in_place(self, request: Request, batch: ScheduledBatch) -> bool:
        """The common step of a busy server, without the general planning: one sequence
        decoding one token into a block it already holds alone (no allocation, no copy).
        False, having changed nothing, for anything else."""
        if len(request.seqs) != 1:
            return False
        seq = request.seqs[0]
        computed = seq.num_computed_tokens
        if len(seq.token_ids) - computed != 1:
            return False
        if not self.block_manager.holds_next_slot(seq):
            return False
        batch.seqs.append(seq)
        batch.num_new_tokens.append(1)
        return True

    def _plan(self, request: Request, budget: int, allowance: PromptAllowance) -> list[tuple[Sequence, int]]:
        """Tokens per sequence of ``request`` within ``budget`` (a prompt chunk also within
        this step's ``allowance``).

        The sequences of a forked request (n > 1, beams) are sampled together, so
        after a preemption none of them takes its last token until all can."""
        cut = self.block_manager.chunk_limit
        wants = [(s, cut(s, s.num_tokens - s.num_computed_tokens)) for s in request.seqs]
        if any(w > 1 for _, w in wants):  # a prompt chunk: the step's time budget
            budget = allowance.cap(budget)
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
        self, request: Request, plan: list[tuple[Sequence, int]], batch: ScheduledBatch, scheduled: set[int]
    ) -> bool:
        bm = self.block_manager
        while sum(bm.blocks_needed(s, n) for s, n in plan) > bm.num_free_blocks:
            victim = self._choose_victim(scheduled)
            self._preempt(victim, batch)
            if victim is request:
                return False
        for seq, n in plan:
            ok = bm.allocate_slots(seq, n)
            assert ok, "blocks_needed promised enough free blocks"
        return True

    def _choose_victim(self, scheduled: set[int]) -> Request:
        """Fewest preemptions first, newest first among equals; requests already given
        tokens in this step are kept (the one being planned is always a candidate)."""
        candidates = [(i, r) for i, r in enumerate(self.running) if id(r) not in scheduled]
        _, victim = min(candidates, key=lambda ir: (ir[1].num_preemptions, -ir[0]))
        return victim

    def _preempt(self, request: Request, batch: ScheduledBatch) -> None:
        self.running.remove(request)
        request.kv_loaded = False
        request.skip_lower_tiers = not self._swap_out(request)
        for seq in request.seqs:
            self.block_manager.free(seq)
            seq.reset_for_recompute()
        if not self.running and not self.loading:
            # It was alone and still did not fit: it never will.
            request.status = RequestStatus.FINISHED
            batch.out_of_memory.append(request)
            return
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        batch.preempted.append(request)

    # ---- lower KV tiers -------------------------------------------------------------
    def _swap_out(self, request: Request) -> bool:
        """Swap (True) or recompute (False) a preempted request: the tiers decide for a
        single sequence (``BlockManager.swap_out``); its blocks come back through
        ``_start_loading`` at re-admission."""
        if len(request.seqs) != 1 or not self.block_manager.swap_out(request.seqs[0]):
            return False
        self.num_swaps += 1
        return True

    def _start_loading(self, request: Request) -> bool | None:
        """Admit ``request`` into the loading state if its prefix continues in a lower
        tier and reading is cheaper than recomputing. False: nothing to load, admit it
        normally; None: there is, but the pool has no room for it now (admitting it
        normally would recompute what a tier holds), so it waits like a request the
        pool cannot take."""
        bm = self.block_manager
        if request.kv_loaded or request.skip_lower_tiers or len(request.seqs) != 1:
            return False
        seq = request.seqs[0]
        prefix = bm.prefix_to_load(seq)
        if prefix is None:
            return False
        if prefix.num_to_take > bm.num_free_blocks:
            return None if self.running or self.loading else False
        bm.admit(seq, prefix.hits)
        bm.start_loads(seq, prefix.lower)
        request.status = RequestStatus.LOADING_KV
        self.loading.append(request)
        return True

    def _finish_loading(self) -> None:
        """Requests whose reads are done start running, holding their blocks (the loaded
        ones now registered in the prefix cache); their prefill continues from there.
        A block that could not be served is simply recomputed by that prefill."""
        bm = self.block_manager
        for request in [r for r in self.loading if bm.loads_done(r.seqs[0])]:
            seq = request.seqs[0]
            first = request.num_preemptions == 0
            served = bm.complete_loads(seq, count_hits=first)
            self.loading.remove(request)
            request.kv_loaded = True
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            if first:
                request.num_loaded_tokens = served
                request.num_cached_tokens = seq.num_computed_tokens
                bm.record_lookup(seq.num_tokens, seq.num_computed_tokens, served)

    def wait_for_loads(self, timeout: float) -> None:
        """Nothing else to run: block briefly on the oldest pending read or grammar
        compile, not spin."""
        for request in self.waiting:
            if request.grammar_pending:
                with contextlib.suppress(Exception):
                    request.grammar.exception(timeout)
                return
        for request in self.loading:
            for load in request.seqs[0].pending_loads:
                if load.future is not None and not load.future.done():
                    try:
                        load.future.result(timeout)
                    except Exception:  # noqa: BLE001 - a failed read is handled by complete_loads
                        pass
                    return

    def _admit(
        self, request: Request, budget: int, allowance: PromptAllowance
    ) -> list[tuple[Sequence, int]] | None:
        """Give a waiting request its cached prefix and the blocks for its first chunk,
        or change nothing and return None when the pool cannot take it now."""
        bm = self.block_manager
        for seq in request.seqs:
            bm.admit(seq, bm.match_prefix(seq))
        plan = self._plan(request, budget, allowance)
        if not plan and allowance.spent and room_for_prompt(bm, request):
            # This step's prompt time is spent: it takes its seat and cached prefix now, and
            # from the next step its chunks compete by uncached tokens (``prompt_order``).
            plan = []
        elif not plan or sum(bm.blocks_needed(s, n) for s, n in plan) > bm.num_free_blocks:
            plan = None
        if plan is not None:
            for seq, n in plan:
                bm.allocate_slots(seq, n)
            if request.num_preemptions == 0 and not request.forked:
                seq = request.seqs[0]
                request.num_cached_tokens = seq.num_computed_tokens
                bm.record_lookup(seq.num_tokens, seq.num_computed_tokens, request.num_loaded_tokens)
            return plan
        for seq in request.seqs:
            bm.free(seq)
            seq.reset_for_recompute()
        return None
