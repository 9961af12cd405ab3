"""The synchronous engine: requests in, one step at a time, deltas out.

``LLMEngine.step()`` = schedule → run the model → sample → apply stop rules →
free what finished → return a ``StreamDelta`` per sequence that moved. The
offline ``LLM`` and the threaded ``AsyncEngine`` both drive this class.

Stop rules and the building of deltas are in ``inference.sampling.stop_rules``; the scheduler,
block manager, tiers and sampler are their own modules.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import deque

import torch

from inference.config import EngineConfig, num_kv_blocks
from inference.engine.metrics import EngineMetrics
from inference.engine.outputs import CompletionOutput, EngineStats, RequestOutput, StreamDelta
from inference.engine.scheduler import ScheduledBatch, Scheduler
from inference.engine.sequence import Request, RequestStatus, Sequence
from inference.errors import EngineOverloadedError, PromptTooLongError
from inference.kv.block_manager import BlockManager, salt_hash
from inference.kv.tiers import build_tiers, tier_stats
from inference.model_config import ModelConfig
from inference.runner.cuda_graphs import MAX_GRAPH_BATCH
from inference.runner.model_loader import load_model
from inference.runner.model_runner import ModelRunner
from inference.sampling.beam_search import beam_step, rank_beams
from inference.sampling.params import SamplingParams
from inference.sampling.reasoning_parser import ReasoningSplitter
from inference.sampling.sampler import Sampler
from inference.sampling.stop_rules import append_token, stream_deltas
from inference.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

RATE_WINDOW_S = 10.0  # tokens_per_s averages over this many recent seconds


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        loaded: tuple[torch.nn.Module, Tokenizer, ModelConfig] | None = None,
        **overrides: object,
    ) -> None:
        """Load ``config.model`` (or reuse ``loaded`` = ``load_model``'s result, so tests and
        benchmarks can build several engines on one copy of the weights)."""
        config = config or EngineConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)  # type: ignore[arg-type]
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        if loaded is None:
            loaded = load_model(config.model, config.device, config.dtype, config.weights_cache_dir)
        self.model, self.tokenizer, self.model_config = loaded
        param = next(self.model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.model_name = self.model_config.name
        mc, bs = self.model_config, config.block_size
        self.kv_spec = self.model.kv_spec  # declared by the model class: sizes the pool
        block_bytes = self.kv_spec.block_bytes(bs, self.dtype)
        # CUDA: keep room for the largest step's activations and logits, and for the
        # CUDA graphs' private memory pool (the activations of their largest batch).
        max_decode_batch = min(config.max_num_seqs, config.max_num_batched_tokens)
        graph_tokens = 0 if config.enforce_eager else min(max_decode_batch, MAX_GRAPH_BATCH)
        reserve = (config.max_num_batched_tokens + graph_tokens) * (
            mc.hidden_size * 16 + mc.intermediate_size * 8
        ) + config.max_num_seqs * mc.vocab_size * 8
        num_blocks = num_kv_blocks(config, block_bytes, self.device, reserve)
        # A lone sequence must be able to grow to the limit, or it could never finish.
        self.max_model_len = min(config.resolve_max_model_len(mc.max_model_len), num_blocks * bs)
        self.block_manager = BlockManager(num_blocks, bs, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_batched_tokens, config.max_num_seqs, self.max_model_len
        )
        self.runner = ModelRunner(
            self.model,
            mc,
            num_blocks,
            bs,
            self.device,
            self.dtype,
            max_num_seqs=max_decode_batch,
            max_model_len=self.max_model_len,
            enforce_eager=config.enforce_eager,
        )
        # Tiers below the pool need the pool itself, so they join the block manager now.
        self.tiers = build_tiers(
            self.runner.kv_cache,
            bs,
            model=self.model,
            kv_cpu_gb=config.kv_cpu_gb,
            kv_disk_dir=config.kv_disk_dir,
            kv_disk_gb=config.kv_disk_gb,
            is_retained=self.block_manager.is_retained,
        )
        self.block_manager.tiers = self.tiers
        self.metrics = EngineMetrics()
        self.sampler = Sampler(self.device, config.seed)
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self._pending: list[StreamDelta] = []  # abort deltas, returned by the next step
        # Stats.
        self.num_steps = 0
        self.total_generated_tokens = 0
        self.total_prompt_tokens = 0
        self.total_computed_tokens = 0  # tokens the model ran (prefill + decode), recomputation included
        self._recent: deque[tuple[float, float, int]] = deque()  # (step start, end, tokens generated)
        self.peak_kv_blocks_used = 0
        self.kv_waste_at_peak = 0.0
        self._kv_slots_used = 0
        logger.info(
            "engine: %s on %s/%s, %d KV blocks of %d tokens (%.2f GiB), max_model_len %d",
            self.model_name,
            self.device,
            self.dtype,
            num_blocks,
            bs,
            num_blocks * block_bytes / 2**30,
            self.max_model_len,
        )

    # ---- requests -------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]

    def check_prompt(self, token_ids: list[int]) -> None:
        """Raise ``PromptTooLongError`` for a prompt that can never run (thread-safe)."""
        self.scheduler.check_prompt(len(token_ids))

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        owner: str | None = None,
        cache_salt: str | None = None,
        cache_salt_from: int = 0,
    ) -> Request:
        """Queue a request. ``owner`` (a user, an API key) gets a fair share of admissions
        against other owners. ``cache_salt`` keeps the prefix cache of the prompt's tokens
        from ``cache_salt_from`` on private to requests with the same salt (the blocks
        wholly before it, e.g. a shared system prompt, stay shared)."""
        params = params or SamplingParams()
        token_ids = self.encode_prompt(prompt)
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        try:
            self.check_prompt(token_ids)
            if len(self.scheduler.waiting) >= self.config.max_waiting:
                raise EngineOverloadedError(f"{len(self.scheduler.waiting)} requests are already waiting")
        except (PromptTooLongError, EngineOverloadedError):
            self.metrics.count("rejected")
            raise
        request = Request(
            request_id, token_ids, params, prompt=prompt if isinstance(prompt, str) else None, owner=owner
        )
        if cache_salt:
            request.cache_salt = salt_hash(cache_salt)
            request.cache_salt_block = max(0, cache_salt_from) // self.block_manager.block_size
        request.seqs.append(self._new_seq(request, token_ids, index=0))
        self.scheduler.add(request)
        self.requests[request_id] = request
        self.total_prompt_tokens += len(token_ids)
        return request

    def _new_seq(self, request: Request, token_ids: list[int], index: int) -> Sequence:
        params = request.params
        seq = Sequence(list(token_ids), request.num_prompt_tokens, index=index, request=request)
        seq.cache_salt, seq.cache_salt_block = request.cache_salt, request.cache_salt_block
        if params.seed is not None and not params.use_beam_search:
            seq.generator = self.sampler.make_generator(params.seed + index)
        if not params.use_beam_search:
            seq.detokenizer = self.tokenizer.detokenizer()
            seq.reasoning = self._reasoning_splitter(params, token_ids)
        if params.logprobs is not None:
            seq.logprobs = []
        return seq

    def _reasoning_splitter(self, params: SamplingParams, prompt_ids: list[int]) -> ReasoningSplitter | None:
        tags = self.tokenizer.reasoning_tags
        if not params.separate_reasoning or tags is None:
            return None
        # R1's generation prompt opens <think> itself; the tag may be a plain added
        # token, so decode without dropping special tokens.
        tail = self.tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False)
        return ReasoningSplitter(tags, in_reasoning=tail.rstrip().endswith(tags[0]))

    def fork(self, request: Request, parent: Sequence, index: int) -> Sequence:
        """A new sequence sharing ``parent``'s tokens and KV blocks."""
        child = self._new_seq(request, parent.token_ids, index)
        child.cumulative_logprob = parent.cumulative_logprob
        if parent.logprobs is not None:
            child.logprobs = list(parent.logprobs)
        self.block_manager.fork(parent, child)
        request.seqs.append(child)
        return child

    def abort(self, request_id: str, outcome: str = "abort") -> bool:
        """Stop a request now and free its blocks; its final deltas come with the next step.
        ``outcome`` names it in the metrics ("error" when the engine failed it)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        self.metrics.count(outcome)
        if request.params.use_beam_search:
            live = sorted(request.seqs, key=lambda s: -s.cumulative_logprob)
            self.scheduler.abort(request)
            request.beam_outputs = rank_beams(self, request, request.beam_hyps + live)
            self._pending += self._beam_deltas(request)
            return True
        live = list(request.seqs)
        self.scheduler.abort(request)
        for seq in live:
            seq.output_text += seq.detokenizer.flush() if seq.detokenizer else ""
        self._pending += stream_deltas(request, live)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    # ---- retention and tiers ----------------------------------------------------------
    def retain(
        self, key: str, token_ids: list[int], *, cache_salt: str | None = None, cache_salt_from: int = 0
    ) -> int:
        """Keep the KV blocks of ``token_ids`` (e.g. an open conversation's history) in
        memory longest: evicted last, and to the next tier, never dropped. ``key``
        replaces its earlier prefix. ``cache_salt`` / ``cache_salt_from`` must be those the
        conversation's requests pass to ``add_request``. Returns the number of full blocks marked."""
        salt = salt_hash(cache_salt) if cache_salt else 0
        salt_block = max(0, cache_salt_from) // self.block_manager.block_size
        return self.block_manager.retain(key, [int(t) for t in token_ids], salt, salt_block if salt else 0)

    def release(self, key: str) -> None:
        """Undo ``retain(key, ...)`` (the conversation's last tab closed)."""
        self.block_manager.release(key)

    def close(self) -> None:
        """Finish queued KV writes and stop the tiers' I/O threads."""
        if self.tiers is not None:
            self.tiers.close()

    # ---- one step -------------------------------------------------------------------
    def step(self) -> list[StreamDelta]:
        deltas, self._pending = self._pending, []
        started = time.monotonic()
        batch = self.scheduler.schedule()
        for request in batch.out_of_memory:
            logger.warning("request %s cannot grow inside the KV pool; finishing it", request.request_id)
            deltas += self._finish_out_of_memory(request)
        if not batch.seqs:
            if self.scheduler.loading:
                self.scheduler.wait_for_loads(0.01)  # only reads pending: do not spin
            return deltas
        self._track_kv_usage(batch)
        if self.tiers is not None:
            self.tiers.before_forward()
        logits, sampled = self.runner.execute(batch)
        if self.tiers is not None:
            self.tiers.observe_prefill(time.monotonic() - started, batch.num_tokens)
        self.scheduler.finish_step(batch)
        generated = 0
        if logits is not None:
            seqs = [batch.seqs[i] for i in sampled]
            new, generated = self._process_samples(seqs, logits)
            deltas += new
        self.num_steps += 1
        self.total_computed_tokens += batch.num_tokens
        self.total_generated_tokens += generated
        self._recent.append((started, time.monotonic(), generated))
        return deltas

    def tokens_per_s(self, now: float | None = None) -> float:
        """Generated tokens per second over the last ``RATE_WINDOW_S`` (0 when idle that long)."""
        now = time.monotonic() if now is None else now
        while self._recent and self._recent[0][1] < now - RATE_WINDOW_S:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = now - self._recent[0][0]
        return sum(n for _, _, n in self._recent) / span if span > 0 else 0.0

    def _process_samples(self, seqs: list[Sequence], logits: torch.Tensor) -> tuple[list[StreamDelta], int]:
        """Sample a token for every sequence that reached its end; beams step as a group."""
        groups: dict[Request, list[int]] = {}
        for row, seq in enumerate(seqs):
            groups.setdefault(seq.request, []).append(row)  # type: ignore[arg-type]
        rows: list[int] = []
        sample_seqs: list[Sequence] = []
        generated = 0
        for request, request_rows in groups.items():
            if request.params.use_beam_search:
                continue
            if not request.forked and request.params.n > 1:
                # First token of n parallel samples: split the prompt's sequence, sharing
                # its blocks; each child samples from the same logits with its own noise.
                parent = seqs[request_rows[0]]
                for index in range(1, request.params.n):
                    self.fork(request, parent, index)
                request.forked = True
                rows += request_rows * request.params.n
                sample_seqs += request.seqs
            else:
                rows += request_rows
                sample_seqs += [seqs[r] for r in request_rows]
        deltas: list[StreamDelta] = []
        if sample_seqs:
            chosen = logits if rows == list(range(len(seqs))) else logits[rows]
            params = [s.request.params for s in sample_seqs]  # type: ignore[union-attr]
            result = self.sampler(chosen, sample_seqs, params)
            for i, (seq, token) in enumerate(zip(sample_seqs, result.token_ids, strict=True)):
                if result.top_logprobs is not None and seq.logprobs is not None:
                    seq.cumulative_logprob += result.logprobs[i]  # type: ignore[index]
                    seq.logprobs.append(result.top_logprobs[i])  # type: ignore[arg-type]
                append_token(seq, token, self.eos_token_ids, self.max_model_len)
            generated += len(sample_seqs)
        now = time.monotonic()
        for request, request_rows in groups.items():
            if request.first_token_time is None:
                request.first_token_time = now
                self.metrics.ttft.observe(now - request.arrival_time)
                self.metrics.cached_tokens += request.num_cached_tokens
            if request.params.use_beam_search:
                beams = [seqs[r] for r in request_rows]
                generated += len(beams)
                if beam_step(self, request, logits[request_rows], beams):
                    deltas += self._beam_deltas(request)
                    self._count_finished(request)
                continue
            touched = list(request.seqs)
            for seq in touched:
                if seq.is_finished:
                    self.scheduler.finish_seq(request, seq)
            deltas += stream_deltas(request, touched)
            if request.is_finished:
                self.requests.pop(request.request_id, None)
                request.finish_time = now
                self._count_finished(request)
        return deltas, generated

    def _count_finished(self, request: Request) -> None:
        outputs = request.outputs_in_order()
        self.metrics.count((outputs[0].finish_reason if outputs else None) or "stop")
        decoded = max((s.num_output_tokens for s in outputs), default=0) - 1
        if decoded > 0 and request.first_token_time is not None and request.finish_time is not None:
            self.metrics.tpot.observe((request.finish_time - request.first_token_time) / decoded)

    def _beam_deltas(self, request: Request) -> list[StreamDelta]:
        """Beams are only final at the end, so they stream as one delta per output."""
        for seq in request.beam_outputs or []:
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
        return stream_deltas(request, request.beam_outputs or [])

    def _finish_out_of_memory(self, request: Request) -> list[StreamDelta]:
        self.requests.pop(request.request_id, None)
        self.metrics.count("length")
        if request.params.use_beam_search:
            for seq in request.seqs:
                seq.finish_reason = "length"
            request.beam_outputs = rank_beams(self, request, request.beam_hyps + request.seqs)
            request.seqs = []
            return self._beam_deltas(request)
        live = list(request.seqs)
        for seq in live:
            seq.finish_reason = "length"
            seq.output_text += seq.detokenizer.flush()
            request.seqs.remove(seq)
            request.finished_seqs.append(seq)
        return stream_deltas(request, live)

    # ---- outputs and stats ----------------------------------------------------------
    def request_output(self, request: Request) -> RequestOutput:
        outputs = [
            CompletionOutput(
                index=seq.index,
                text=seq.output_text if seq.reasoning is None else seq.reasoning.answer,
                reasoning="" if seq.reasoning is None else seq.reasoning.reasoning,
                token_ids=seq.output_token_ids,
                cumulative_logprob=seq.cumulative_logprob
                if (seq.logprobs is not None or request.params.use_beam_search)
                else None,
                logprobs=seq.logprobs,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
            )
            for seq in request.outputs_in_order()
        ]
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=outputs,
            finished=request.status is RequestStatus.FINISHED,
            num_cached_tokens=request.num_cached_tokens,
        )

    def _track_kv_usage(self, batch: ScheduledBatch) -> None:
        """Token slots holding K/V (after this step's writes) versus blocks in use: only
        each sequence's last block can be partly filled; forks share tails, so a
        block counts once at its fullest."""
        bs = self.block_manager.block_size
        scheduled = {seq.seq_id: n for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)}
        tails: dict[int, int] = {}
        for request in self.scheduler.running:
            for seq in request.seqs:
                if seq.block_table:
                    end = seq.num_computed_tokens + scheduled.get(seq.seq_id, 0)
                    block = seq.block_table[-1]
                    tails[block] = max(tails.get(block, 0), end - (len(seq.block_table) - 1) * bs)
        used = self.block_manager.num_blocks - self.block_manager.num_free_blocks
        partial = [fill for fill in tails.values() if fill < bs]
        self._kv_slots_used = (used - len(partial)) * bs + sum(partial)
        if used > self.peak_kv_blocks_used:
            self.peak_kv_blocks_used = used
            self.kv_waste_at_peak = 1 - self._kv_slots_used / (used * bs)

    def stats(self) -> EngineStats:
        blocks = self.block_manager.stats()
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_total=blocks.total,
            kv_blocks_used=blocks.used,
            kv_blocks_cached=blocks.cached,
            kv_blocks_free=blocks.free,
            kv_block_size=self.block_manager.block_size,
            kv_slots_used=self._kv_slots_used if blocks.used else 0,
            prefix_hit_rate=blocks.hit_rate,
            prefix_hit_tokens=blocks.hit_tokens,
            prefix_queried_tokens=blocks.queried_tokens,
            tokens_per_s=self.tokens_per_s(),
            total_generated_tokens=self.total_generated_tokens,
            total_prompt_tokens=self.total_prompt_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self.num_steps,
            loading=len(self.scheduler.loading),
            num_swaps=self.scheduler.num_swaps,
            cached_tokens=self.metrics.cached_tokens,
            kv_retained_keys=self.block_manager.num_retained_keys,
            kv_retained_blocks=self.block_manager.num_retained_blocks,
            requests_by_outcome=dict(self.metrics.outcomes),
            ttft=self.metrics.ttft.as_dict(),
            tpot=self.metrics.tpot.as_dict(),
            kv_tiers=tier_stats(blocks, self.tiers),
            extra=self._extra_stats(),
        )

    def _extra_stats(self) -> dict[str, float]:
        extra: dict[str, float] = {
            "peak_kv_blocks_used": self.peak_kv_blocks_used,
            "kv_waste_at_peak": self.kv_waste_at_peak,
        }
        if self.runner.cuda_graphs is not None:
            extra["cuda_graph_steps"] = self.runner.cuda_graphs.num_replays
        return extra
