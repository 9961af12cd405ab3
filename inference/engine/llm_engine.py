"""The synchronous engine: requests in, one step at a time, deltas out.

``LLMEngine.step()`` = schedule → run the model → sample → apply stop rules →
free what finished → return a ``StreamDelta`` per sequence that moved. The
offline ``LLM`` and the threaded ``AsyncEngine`` both drive this class.

Seams: ``Admission``, ``EngineMetrics``, ``SequenceFactory``, ``EngineConfig.size_kv_pool``;
beam search (``beam_step``) and speculation (``inference.spec``) decide, the engine applies.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid

import torch

from inference.config import EngineConfig
from inference.engine.admission import Admission
from inference.engine.embedding_jobs import EmbeddingQueue, EmbedJob, advance, fit_chunk, result
from inference.engine.embedding_share import EMBED_TURN_SHARE_OF_BUDGET, EmbeddingShare
from inference.engine.kv_stack import build_kv_stack
from inference.engine.metrics import EngineMetrics
from inference.engine.next_tokens import finish_for_length, sample_next_tokens
from inference.engine.outputs import EngineStats, RequestOutput, StreamDelta, request_output
from inference.engine.pooling import embed_token_ids
from inference.engine.sequence import Request, Sequence
from inference.engine.sequence_factory import SequenceFactory, make_private
from inference.engine.stats import engine_stats, observe_kv_usage
from inference.engine.step_budget import MIN_CHUNK
from inference.engine.token_gate import TokenGate, charge_step
from inference.kv.salt import cache_salt as derive_cache_salt
from inference.kv.salt import salt_hash
from inference.lora import LoraAdapter, LoraLoadError, LoraManager
from inference.model_config import ModelConfig
from inference.models.contract import CausalLM
from inference.runner.model_loader import load_model
from inference.sampling.beam_search import (
    BeamDecision,
    beam_step,
    final_beam_deltas,
    keep_best_hypotheses,
    rank_beams,
)
from inference.sampling.logit_rules import apply_logit_rules
from inference.sampling.params import SamplingParams
from inference.sampling.sampler import Sampler
from inference.sampling.stop_rules import stream_deltas
from inference.spec.build import build_speculator
from inference.structured import apply_grammar_masks
from inference.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        loaded: tuple[CausalLM, Tokenizer, ModelConfig] | None = None,
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
        self.tokenizer.byte_pieces()  # the detokenizers' table, built now rather than at the first request
        param = next(self.model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.model_name = config.served_name or self.model_config.name
        self.kv_spec = self.model.kv_spec  # declared by the model class: sizes the pool
        kv = build_kv_stack(config, self.model, self.model_config, self.tokenizer)
        self.max_model_len = kv.pool.max_model_len
        self.block_manager, self.scheduler = kv.block_manager, kv.scheduler
        self.runner, self.tiers = kv.runner, kv.tiers
        self.metrics = EngineMetrics()
        self.admission = Admission(
            self.scheduler, config.max_waiting, self.metrics, self.model_config.vocab_size
        )
        self.sampler = Sampler(self.device, config.seed, self.tokenizer.eos_token_ids)
        self.sequences = SequenceFactory(
            self.tokenizer,
            self.sampler,
            self.block_manager,
            self.model_config.vocab_size,
            grammar_options={
                "max_workers": config.grammar_workers,
                "max_queue": config.grammar_max_queue,
                "max_per_owner": config.grammar_max_per_owner,
                "time_limit": config.grammar_time_limit_s,
            },
        )
        self.grammars = self.sequences.grammars  # compile_grammar checks a grammar before a request
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.speculator = build_speculator(config, self)
        self.loras: LoraManager | None = None
        if config.max_loras:
            try:
                self.loras = LoraManager(self.model, config.max_loras, config.max_lora_rank)
            except LoraLoadError as exc:  # another architecture: served without adapters
                logger.info("engine: %s; no LoRA adapters for %s", exc, self.model_name)
            else:
                self.runner.lora, self.scheduler.max_loras = self.loras, config.max_loras
        self._pending: list[StreamDelta] = []  # abort deltas, returned by the next step
        self.embeddings = EmbeddingQueue(
            config.embed_max_queued_tokens, config.embed_max_queued_tokens_per_owner
        )
        budget_s = config.step_budget_ms / 1000
        self.embedding_share = EmbeddingShare(turn_s=EMBED_TURN_SHARE_OF_BUDGET * budget_s)

    # ---- requests -------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]

    def check_prompt(self, token_ids: list[int]) -> None:
        """Raise ``PromptTooLongError`` / ``InvalidPromptError`` for a prompt that can never
        run (thread-safe)."""
        self.admission.check_prompt(token_ids)

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        owner: str | None = None,
        cache_namespace: str | None = None,
        cache_salt: str | None = None,
        cache_salt_from: int = 0,
        weight: float = 1.0,
        token_gate: TokenGate | None = None,
        adapter: str | None = None,
    ) -> Request:
        """Queue a request. ``adapter``: the LoRA adapter it runs (``add_adapter``'s name;
        None: the base model). ``owner`` (a user, an API key) gets a fair share of admissions
        against other owners, in proportion to ``weight``; ``token_gate`` is charged its
        output tokens every step and stops it when spent (``inference.engine.token_gate``). ``cache_namespace`` (a site's user, ``"user:<id>"``) keeps
        the prefix cache of the prompt's tokens from ``cache_salt_from`` on private to
        requests of the same namespace, and ``cache_salt`` (a caller's, nested inside the
        namespace) to requests with the same salt too (the blocks wholly before it, e.g. a
        shared system prompt, stay shared). See ``inference.kv.salt``."""
        params = params or SamplingParams()
        token_ids = self.encode_prompt(prompt)
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        adapter_key = self.adapter_key(adapter)
        self.admission.admit(token_ids)
        request = self.sequences.new_request(
            request_id,
            prompt,
            token_ids,
            params,
            owner=owner,
            cache_namespace=cache_namespace,
            cache_salt=cache_salt,
            cache_salt_from=cache_salt_from,
        )
        if weight <= 0:
            raise ValueError("a fair-share weight must be positive")
        request.weight, request.token_gate = weight, token_gate
        if adapter is not None:
            request.adapter, request.adapter_key = adapter, adapter_key
            for seq in request.seqs:
                seq.adapter, seq.adapter_key = adapter, adapter_key
        self.scheduler.add(request)
        self.requests[request_id] = request
        self.metrics.total_prompt_tokens += len(token_ids)
        return request

    # ---- LoRA adapters ------------------------------------------------------------------
    def adapter_key(self, adapter: str | None) -> int:
        """The key of a served adapter (0 for None); ValueError for one not served."""
        if adapter is None:
            return 0
        found = self.loras.get(adapter) if self.loras is not None else None
        if found is None:
            raise ValueError(f"the LoRA adapter {adapter!r} is not loaded")
        return found.key

    def add_adapter(self, adapter: LoraAdapter) -> None:
        """Serve ``adapter`` under its name; one of that name is replaced (its running
        requests are aborted: their blocks were computed with the old weights)."""
        if self.loras is None:
            raise ValueError("this engine serves no LoRA adapters (EngineConfig.max_loras is 0)")
        self._abort_adapter(adapter.name)
        self.loras.add(adapter)

    def remove_adapter(self, name: str) -> bool:
        """Stop serving adapter ``name``: its running requests are aborted first."""
        if self.loras is None:
            return False
        self._abort_adapter(name)
        return self.loras.remove(name)

    def _abort_adapter(self, name: str) -> None:
        for request_id, request in list(self.requests.items()):
            if request.adapter == name:
                self.abort(request_id)

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
            request.beam_outputs = self._rank_beams(request, request.beam_hyps + live)
            self._pending += final_beam_deltas(request)
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
        self,
        key: str,
        token_ids: list[int],
        *,
        cache_namespace: str | None = None,
        cache_salt: str | None = None,
        cache_salt_from: int = 0,
        adapter: str | None = None,
    ) -> int:
        """Keep the KV blocks of ``token_ids`` (an open conversation's history) in memory
        longest: evicted last, to the next tier. ``key`` replaces its earlier prefix; the cache
        options are those its requests pass to ``add_request``. Returns the blocks marked."""
        salt = derive_cache_salt(cache_namespace, cache_salt).value
        salt_block = max(0, cache_salt_from) // self.block_manager.block_size
        ids = [int(t) for t in token_ids]
        return self.block_manager.retain(key, ids, salt, salt_block if salt else 0, self.adapter_key(adapter))

    def purge_namespace(self, namespace: str) -> int:
        """Forget every KV block salted in ``namespace`` (``add_request``'s
        ``cache_namespace``): cached ones leave the pool and every tier (disk files
        deleted); ones held by running requests are never served again and go back empty
        when freed, and those requests publish no more blocks. Returns the pool blocks
        dropped."""
        root = salt_hash(namespace)
        make_private(self.requests.values(), root)
        self.scheduler.purge_namespace(root)
        return self.block_manager.purge_namespace(root)

    def release(self, key: str) -> None:
        """Undo ``retain(key, ...)`` (the conversation's last tab closed)."""
        self.block_manager.release(key)

    def embed(self, inputs: list[list[int]]) -> torch.Tensor:
        """``[N, hidden]`` fp32: each input's mean last hidden state, L2-normalised, from a
        forward over a scratch pool (``inference.engine.pooling``); no KV block is kept.
        Raises ``PromptTooLongError`` / ``InvalidPromptError`` as a prompt would."""
        for ids in inputs:
            self.admission.check_prompt(ids)
        return embed_token_ids(
            self.model,
            inputs,
            block_size=self.block_manager.block_size,
            device=self.device,
            dtype=self.dtype,
            max_batch_tokens=self.config.max_num_batched_tokens,
        )

    def add_embedding(self, job: EmbedJob) -> None:
        """Queue an embedding job (its tokens already counted in by ``embeddings.admit``);
        ``embed_turn`` advances it between steps. Raises as ``embed`` for a bad input."""
        try:
            for ids in job.inputs:
                self.admission.check_prompt(ids)
        except Exception:
            self.embeddings.release(job.num_tokens, job.owner)
            raise
        self.embeddings.add(job)
        self.scheduler.external_seats = self.embeddings.owners()

    def embed_turn(self) -> bool:
        """Advance one embedding job by one chunk (``inference.engine.embedding_jobs``);
        while requests run, only when the turn is paid for from the embeddings' share of
        the engine's time (``inference.engine.embedding_share``). False when none ran."""
        budget = self.scheduler.step_budget
        if not self.embeddings:
            return False
        seconds = None if budget is None else self.embedding_share.allowance(self.scheduler.has_unfinished())
        if seconds == 0.0:
            return False  # the turn waits for credit: the streams' steps come first
        ran = 0
        try:
            job = self.embeddings.next_job()
            assert job is not None
            if job.done.cancelled():  # its caller went away (a client disconnected): drop the work
                self._end_embedding(job)
                return True
            tokens = self.config.max_num_batched_tokens
            if budget is not None and seconds is not None:
                fallback = budget.prefill_limit(1) or MIN_CHUNK
                tokens = min(tokens, self.embedding_share.tokens(seconds, fallback, MIN_CHUNK))
                tokens = fit_chunk(job, tokens, seconds)
            ran = self._advance_embedding(job, tokens)
        finally:
            self.embedding_share.charge(ran)
        return True

    def _advance_embedding(self, job: EmbedJob, tokens: int) -> int:
        """One chunk of ``job``; its future gets the vectors when done, or the chunk's error."""
        try:
            ran = advance(
                job,
                self.model,
                tokens,
                block_size=self.block_manager.block_size,
                device=self.device,
                dtype=self.dtype,
            )
            vectors = result(job) if job.finished else None
        except Exception as exc:  # the job's failure, not the engine's
            self._end_embedding(job)
            if job.done.set_running_or_notify_cancel():
                job.done.set_exception(exc)
            return 0
        if vectors is not None:
            self._end_embedding(job)
            if job.done.set_running_or_notify_cancel():
                job.done.set_result(vectors)
        return ran

    def fail_embeddings(self, exc: BaseException) -> None:
        for job in self.embeddings.clear():
            self.embeddings.release(job.num_tokens, job.owner)
            if job.done.set_running_or_notify_cancel():
                job.done.set_exception(exc)
        self.scheduler.external_seats = {}

    def _end_embedding(self, job: EmbedJob) -> None:
        self.embeddings.remove(job)
        self.embeddings.release(job.num_tokens, job.owner)
        self.scheduler.external_seats = self.embeddings.owners()

    def close(self) -> None:
        """Finish queued KV writes, stop the tiers' I/O threads and any prefill workers."""
        self.scheduler.close()
        if self.tiers is not None:
            self.tiers.close()
        self.grammars.close()

    # ---- one step -------------------------------------------------------------------
    def step(self, emit: bool = True) -> list[StreamDelta]:
        """``emit=False``: deltas only for requests that got their first token or finished;
        the others' new tokens come, folded, with the next step that emits (a server
        streams at a cadence; see ``AsyncEngine``). Stop rules apply every step either way."""
        deltas, self._pending = self._pending, []
        started = time.monotonic()
        batch = self.scheduler.schedule()
        for request in batch.out_of_memory:
            logger.warning("request %s cannot grow inside the KV pool; finishing it", request.request_id)
            self.requests.pop(request.request_id, None)
            self.metrics.count("length")
            deltas += finish_for_length(request, self._rank_beams)
        if not batch.seqs:
            if self.scheduler.loading or self.scheduler.waiting:
                self.scheduler.wait_for_loads(0.01)  # only reads or compiles pending: do not spin
            return deltas
        if self.tiers is not None:
            self.tiers.before_forward()
        logits, sampled = self.speculator.split(batch, *self.runner.execute(self.speculator.propose(batch)))
        if self.tiers is not None:
            self.tiers.observe_prefill(time.monotonic() - started, batch.num_tokens)
        self.scheduler.finish_step(batch)
        observe_kv_usage(self.metrics, self.scheduler)
        generated = 0
        if logits is not None or self.speculator.pending:
            rows = [batch.seqs[i] for i in sampled]
            new, generated = self._process_samples(rows, logits, emit)  # type: ignore[arg-type]
            deltas += new
        self.metrics.observe_step(started, batch.num_tokens, generated)
        return deltas

    def _process_samples(
        self, seqs: list[Sequence], logits: torch.Tensor, emit: bool = True
    ) -> tuple[list[StreamDelta], int]:
        """Sample a token for every sequence that reached its end (``logits`` is None when
        all were verified: their tokens come from the speculator); beams step as a group."""
        groups: dict[Request, list[int]] = self.speculator.pending_groups()
        for row, seq in enumerate(seqs):
            groups.setdefault(seq.request, []).append(row)  # type: ignore[arg-type]
        generated = self.speculator.accept() + sample_next_tokens(
            seqs,
            logits,
            groups,
            sampler=self.sampler,
            sequences=self.sequences,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
        )
        deltas: list[StreamDelta] = []
        now = time.monotonic()
        for request, rows in groups.items():
            if request.first_token_time is None:
                self.metrics.observe_first_token(request, now)
            if request.token_gate is not None and not request.params.use_beam_search:
                charge_step(request)
            if request.params.use_beam_search:
                beams = [seqs[r] for r in rows]
                generated += len(beams)
                decision = beam_step(
                    request,
                    apply_logit_rules(
                        apply_grammar_masks(logits[rows], beams),
                        beams,
                        [request.params] * len(beams),
                        self.eos_token_ids,
                    ),
                    beams,
                    eos_token_ids=self.eos_token_ids,
                    max_model_len=self.max_model_len,
                )
                if self._apply_beam_decision(request, decision):
                    deltas += final_beam_deltas(request)
                    self.metrics.observe_finished(request)
                continue
            touched = list(request.seqs)
            any_finished = False
            for seq in touched:
                if seq.finish_reason is not None:
                    any_finished = True
                    self.scheduler.finish_seq(request, seq)
            # A finished sequence leaves request.seqs now: its last delta cannot wait.
            if emit or any_finished or not touched[0].num_emitted_tokens:
                deltas += stream_deltas(request, touched)
            if any_finished and request.is_finished:  # it finishes with its last sequence
                self.requests.pop(request.request_id, None)
                request.finish_time = now
                self.metrics.observe_finished(request)
        return deltas, generated

    def _apply_beam_decision(self, request: Request, decision: BeamDecision) -> bool:
        """Carry out ``beam_step``'s decision on the scheduler and blocks; True when the
        request finished."""
        request.forked = True
        for beam in decision.drop:
            self.scheduler.drop_seq(request, beam)
        for ext in decision.extend:
            seq = self.sequences.fork(request, ext.parent, index=0) if ext.fork else ext.parent
            seq.token_ids.append(ext.token)
            if seq.grammar is not None:
                seq.grammar.accept(ext.token)
            seq.cumulative_logprob = ext.cumulative_logprob
        finished = list(decision.hypotheses)
        if decision.out_of_length:
            for beam in list(request.seqs):
                beam.finish_reason = "length"
                finished.append(beam)
                self.scheduler.drop_seq(request, beam)
        keep_best_hypotheses(request, finished)
        if not decision.done:
            return False
        for beam in list(request.seqs):
            self.scheduler.drop_seq(request, beam)
        self.scheduler.retire(request)
        request.beam_outputs = self._rank_beams(request, request.beam_hyps)
        self.requests.pop(request.request_id, None)
        request.finish_time = time.monotonic()
        return True

    def _rank_beams(self, request: Request, candidates: list[Sequence]) -> list[Sequence]:
        return rank_beams(request, candidates, self.tokenizer, self.eos_token_ids)

    # ---- outputs and stats ----------------------------------------------------------
    def request_output(self, request: Request) -> RequestOutput:
        return request_output(request)

    def stats(self) -> EngineStats:
        return engine_stats(self.scheduler, self.metrics, self.tiers, self.runner.cuda_graphs)
