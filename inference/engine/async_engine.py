"""The engine for a server: one background thread steps the model, asyncio code streams.

- Callers (any event loop, any thread) submit requests and aborts through a
  command queue guarded by a condition variable; the engine thread sleeps on it
  when there is nothing to do, so an idle engine costs no CPU.
- The engine thread alone touches ``LLMEngine``. After each step it hands the
  requests' deltas to their sinks with ``loop.call_soon_threadsafe`` (one call per event
  loop per step): a ``Mailbox`` (``inference.engine.mailbox``) read by ``stream()``, or the
  caller's own object given to ``submit()``, called within the hand-over. A step emits
  deltas only when ``stream_interval`` has passed since the last one that did and the event loops have
  worked through the previous hand-over (``LLMEngine.step(emit)``), besides each
  request's first and last: a stream gets one delta per interval with all its new
  tokens, not one per token, and a loop that falls behind gets larger deltas, not more
  of them (at most ``MAX_HOLD_INTERVALS`` intervals apart). While a hand-over waits, the
  engine thread waits for the loops before the next step (up to ``MAX_HOLD_INTERVALS``
  intervals): with a model that costs the CPU little (a GPU's), it would otherwise take
  the GIL from them to make tokens nobody can deliver yet, which then age in the queues
  (the token-to-socket delay); requests arriving meanwhile join the next step instead of
  a step each. An emit carries at least two steps' tokens, so that a loop slower than the
  interval is not handed one token per stream per write.
- ``stream()`` aborts its request when the consumer stops early: ``break``,
  ``aclose()``, task cancellation or garbage collection of the generator all run
  its ``finally``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from inference.config import EngineConfig
from inference.engine.embedding_jobs import EmbedJob
from inference.engine.llm_engine import LLMEngine
from inference.engine.loop_handover import DeltaSink, LoopHandover, Outbox
from inference.engine.mailbox import Mailbox
from inference.engine.outputs import EngineStats, StreamDelta
from inference.engine.token_budget import TokenGate
from inference.sampling.params import SamplingParams
from inference.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

_REFRESH_S = 1.0  # while recent throughput is non-zero, idle stats refresh this often
# Deltas of a running request reach its consumer at most this often (its first and last at
# once): a 30 ms cadence (33 a second) reads as smooth text and costs the event loop one
# write per stream per interval, not per token; with the loop's own work after a hand-over
# (a few ms to 20 ms at 256 streams on 2 cores) a token reaches its socket within 50 ms.
STREAM_INTERVAL_S = 0.03
MAX_HOLD_INTERVALS = 5  # a busy loop still gets the running streams' tokens this often


@dataclass
class _Add:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    prompt: str | None
    loop: asyncio.AbstractEventLoop
    sink: DeltaSink
    # LLMEngine.add_request's keyword options (owner, cache options, weight, token_gate).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Retain:
    key: str
    token_ids: list[int] | None  # None = release
    options: dict[str, Any] = field(default_factory=dict)  # cache_namespace, cache_salt, cache_salt_from


@dataclass
class _Purge:
    namespace: str
    done: Future[int]


@dataclass
class _Call:
    """A function of the LLMEngine run on the engine thread between steps."""

    fn: Callable[[], Any]
    done: Future[Any]


@dataclass
class _Embed:
    job: EmbedJob


class EngineShutDownError(RuntimeError):
    pass


class AsyncEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        stream_interval: float = STREAM_INTERVAL_S,
        **overrides: Any,
    ) -> None:
        """``stream_interval``: seconds between hand-overs of a running request's deltas
        (0: after every step). ``overrides``: ``LLMEngine``'s.

        The ``LLMEngine`` is built in the engine thread, which then steps it: every OpenMP
        team the model's kernels fork belongs to that one thread. A second thread forking
        one (building the engine here, then stepping it there) makes libgomp manage more
        threads than a 2-core machine has CPUs, and it then caps every idle thread's spin
        at 100 rounds: each of a decode step's ~240 parallel regions wakes a sleeping
        thread again (measured: 23.1 against 9.2 ms a single-stream step)."""
        self.stream_interval = stream_interval
        self._last_emit = 0.0  # engine thread only
        self._quiet_steps = 0  # steps since the last that emitted (engine thread only)
        self._idle = True  # no request ran at the last turn (engine thread only)
        self._handover = LoopHandover()
        self._cond = threading.Condition()
        self._commands: deque[_Add | _Abort | _Retain | _Purge | _Embed | _Call] = deque()
        self._num_pending_adds = 0
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, DeltaSink]] = {}  # engine thread only
        self._shutdown = False
        built: Future[LLMEngine] = Future()
        self._thread = threading.Thread(
            target=self._build_and_run, args=(built, config, overrides), name="inference-engine", daemon=True
        )
        self._thread.start()
        self.engine = built.result()  # raises what building raised; the thread has ended then
        self.tokenizer: Tokenizer = self.engine.tokenizer
        self.model_name: str = self.engine.model_name
        self.max_model_len: int = self.engine.max_model_len
        self.grammars = self.engine.grammars  # thread-safe: the API compiles grammars to check them

    # ---- caller side (any thread) ---------------------------------------------------
    async def stream(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        **options: Any,
    ) -> AsyncIterator[StreamDelta]:
        """Deltas of one request until it finishes. Raises ``PromptTooLongError`` or
        ``EngineOverloadedError`` before the first delta. ``options``: ``submit``'s."""
        queue = Mailbox()
        request_id = self.submit(prompt, params, queue, request_id, **options)
        done = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.request_finished  # set before yielding: the consumer may stop here
                yield item
                if done:
                    return
        finally:
            if not done:
                self.abort(request_id)

    def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams | None,
        sink: DeltaSink,
        request_id: str | None = None,
        *,
        owner: str | None = None,
        cache_namespace: str | None = None,
        cache_salt: str | None = None,
        cache_salt_from: int = 0,
        weight: float = 1.0,
        token_gate: TokenGate | None = None,
        adapter: str | None = None,
    ) -> str:
        """Queue a request whose deltas go to ``sink.put_nowait``, called on the calling
        event loop's thread within each hand-over (so it must not block, and should not
        raise), then its failure, if it fails, as an exception instance; its id. Raises
        ``PromptTooLongError`` or ``EngineOverloadedError`` at once. The caller aborts the
        request if it stops listening before the delta with ``request_finished``.
        ``owner``, ``weight``, ``token_gate`` and the cache options: see ``LLMEngine.add_request``."""
        params = params or SamplingParams()
        token_ids = self.engine.encode_prompt(prompt)
        self.engine.admission.admit_prompt(token_ids)
        request_id = request_id or uuid.uuid4().hex
        add = _Add(
            request_id,
            token_ids,
            params,
            prompt if isinstance(prompt, str) else None,
            asyncio.get_running_loop(),
            sink,
            {
                "owner": owner,
                "cache_namespace": cache_namespace,
                "cache_salt": cache_salt,
                "cache_salt_from": cache_salt_from,
                "weight": weight,
                "token_gate": token_gate,
                "adapter": adapter,
            },
        )
        with self._cond:
            if self._shutdown:
                raise EngineShutDownError("the engine is shut down")
            # Adds still in the command queue count as waiting: they reach it before the next step.
            self.engine.admission.admit_to_queue(pending=self._num_pending_adds)
            self._commands.append(add)
            self._num_pending_adds += 1
            self._cond.notify()
        return request_id

    def abort(self, request_id: str) -> None:
        """Thread-safe; the request's blocks are freed before the next step runs."""
        with self._cond:
            self._commands.append(_Abort(request_id))
            self._cond.notify()

    def retain(self, key: str, token_ids: list[int], **options: Any) -> None:
        """Thread-safe ``LLMEngine.retain`` (same options): applied before the next step."""
        self._command(_Retain(key, list(map(int, token_ids)), options))

    def release(self, key: str) -> None:
        """Thread-safe ``LLMEngine.release``."""
        self._command(_Retain(key, None))

    def purge_namespace(self, namespace: str) -> Future[int]:
        """Thread-safe ``LLMEngine.purge_namespace``, applied before the next step; the
        future gives the pool blocks dropped (callers need not wait for it)."""
        done: Future[int] = Future()
        self._command(_Purge(namespace, done))
        return done

    def call_future(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` (of the LLMEngine's state) on the engine thread between steps."""
        done: Future[Any] = Future()
        with self._cond:
            if self._shutdown:
                raise EngineShutDownError("the engine is shut down")
            self._commands.append(_Call(fn, done))
            self._cond.notify()
        return done

    def load_adapter(self, name: str, path: str) -> Future[Any]:
        """Read the PEFT adapter at ``path`` (here, in the caller's thread: a LoraLoadError
        at once for a bad one) and serve it as ``name`` from the next step on."""
        from inference.lora import load_peft_adapter  # noqa: PLC0415 - only with adapters

        adapter = load_peft_adapter(name, path, self.engine.model_config.num_layers)
        return self.call_future(lambda: self.engine.add_adapter(adapter))

    def unload_adapter(self, name: str) -> Future[Any]:
        """Stop serving adapter ``name`` (its running requests are aborted); True if it was served."""
        return self.call_future(lambda: self.engine.remove_adapter(name))

    def adapter_names(self) -> list[str]:
        loras = self.engine.loras
        return loras.names() if loras is not None else []

    def embed_future(self, inputs: list[list[int]], owner: str | None = None) -> Future[Any]:
        """Thread-safe embeddings: the engine thread runs them in chunks between steps,
        sized like a step's prompt tokens, taking turns across owners
        (``inference.engine.embedding_jobs``); the future gives the ``[N, hidden]`` tensor
        or the error. Prompts too long or with unknown ids raise here, and so does
        ``EngineOverloadedError`` when the embedding queue, or ``owner``'s share of it, is
        full, before anything is queued."""
        inputs = [[int(t) for t in ids] for ids in inputs]
        for ids in inputs:
            self.engine.check_prompt(ids)
        job = EmbedJob(inputs, owner, Future())
        with self._cond:
            if self._shutdown:
                raise EngineShutDownError("the engine is shut down")
            self.engine.embeddings.admit(job.num_tokens, owner)
            self._commands.append(_Embed(job))
            self._cond.notify()
        return job.done

    async def embed(self, inputs: list[list[int]], owner: str | None = None) -> Any:
        """``embed_future`` awaited: ``[N, hidden]`` fp32, L2-normalised rows."""
        return await asyncio.wrap_future(self.embed_future(inputs, owner))

    def _command(self, command: _Abort | _Retain | _Purge) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify()

    def stats(self) -> EngineStats:
        """A snapshot taken by the engine thread after its latest step."""
        return self._stats

    def shutdown(self, timeout: float | None = 10.0) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify()
        self._handover.stop()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> AsyncEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- engine thread --------------------------------------------------------------
    def _build_and_run(
        self, built: Future[LLMEngine], config: EngineConfig | None, overrides: dict[str, Any]
    ) -> None:
        try:
            engine = LLMEngine(config, **overrides)
            self._stats = engine.stats()
        except BaseException as exc:
            built.set_exception(exc)
            return
        self.engine = engine
        built.set_result(engine)
        self._run()

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while (
                    not self._commands
                    and not engine.has_unfinished()
                    and not engine.embeddings
                    and not self._shutdown
                ):
                    # Idle: sleep until a command arrives (refreshing the decaying
                    # tokens/s figure now and then, only while it is non-zero).
                    if not self._cond.wait(_REFRESH_S if self._stats.tokens_per_s else None):
                        self._stats = engine.stats()
                if self._shutdown:
                    break
                commands = list(self._commands)
                self._commands.clear()
            outbox: Outbox = {}
            for command in commands:
                self._apply(command, outbox)
            if not engine.has_unfinished():
                self._idle = True
            else:
                if self._idle:  # the interval counts from the first step after a pause
                    self._idle, self._last_emit, self._quiet_steps = False, time.monotonic(), 0
                hold = MAX_HOLD_INTERVALS * self.stream_interval
                caught_up = self._wait_for_loops(hold)
                now = time.monotonic()
                waited = now - self._last_emit
                # Two steps' tokens at least per emit: a loop slower than the interval would
                # otherwise be handed one token per stream per step, each costing it a write.
                emit = waited >= self.stream_interval and (
                    (caught_up and self._quiet_steps > 0) or waited >= hold
                )
                if emit:
                    self._last_emit = now
                    self._quiet_steps = 0
                else:
                    self._quiet_steps += 1
                if not caught_up:
                    time.sleep(0)  # a stalled loop: still let it have the GIL before the step
                try:
                    deltas = engine.step(emit)
                except Exception as exc:  # a model bug must not hang every client
                    logger.exception("engine step failed; failing all requests")
                    self._fail_all(exc, outbox)
                    deltas = []
                for delta in deltas:
                    sink = self._sinks.get(delta.request_id)
                    if sink is None:
                        continue
                    outbox.setdefault(sink[0], []).append((sink[1], delta))
                    if delta.request_finished:
                        del self._sinks[delta.request_id]
            self._stats = engine.stats()
            self._deliver(outbox)
            if engine.embeddings:
                # One chunk of embedding work after the step (and after its deltas went out),
                # sized like its prompt tokens.
                engine.embed_turn()
        outbox = {}
        for command in self._commands:  # embeddings queued behind the shutdown
            if isinstance(command, _Embed):
                engine.embeddings.release(command.job.num_tokens, command.job.owner)
                if command.job.done.set_running_or_notify_cancel():
                    command.job.done.set_exception(EngineShutDownError("the engine shut down"))
        engine.fail_embeddings(EngineShutDownError("the engine shut down"))
        self._fail_all(EngineShutDownError("the engine shut down"), outbox)
        self._deliver(outbox)
        engine.close()

    def _apply(
        self,
        command: _Add | _Abort | _Retain | _Purge | _Embed | _Call,
        outbox: dict[Any, list[tuple[Any, Any]]],
    ) -> None:
        if isinstance(command, _Abort):
            self.engine.abort(command.request_id)
            return
        if isinstance(command, _Call):
            try:
                command.done.set_result(command.fn())
            except Exception as exc:  # the caller's error, not the engine thread's
                command.done.set_exception(exc)
            return
        if isinstance(command, _Embed):
            try:
                self.engine.add_embedding(command.job)
            except Exception as exc:  # the caller's error, not the engine thread's
                if command.job.done.set_running_or_notify_cancel():
                    command.job.done.set_exception(exc)
            return
        if isinstance(command, _Purge):
            try:
                command.done.set_result(self.engine.purge_namespace(command.namespace))
            except Exception as exc:  # a failed purge must not stop the engine thread
                logger.exception("purging KV namespace failed")
                command.done.set_exception(exc)
            return
        if isinstance(command, _Retain):
            if command.token_ids is None:
                self.engine.release(command.key)
            else:
                self.engine.retain(command.key, command.token_ids, **command.options)
            return
        with self._cond:
            self._num_pending_adds -= 1
        try:
            request = self.engine.add_request(
                command.token_ids, command.params, command.request_id, **command.options
            )
            request.prompt = command.prompt
        except Exception as exc:  # duplicate id, overload, bad params: the caller's error
            outbox.setdefault(command.loop, []).append((command.sink, exc))
            return
        self._sinks[command.request_id] = (command.loop, command.sink)

    def _fail_all(self, exc: BaseException, outbox: dict[Any, list[tuple[Any, Any]]]) -> None:
        for request_id, (loop, queue) in list(self._sinks.items()):
            try:
                outcome = "abort" if isinstance(exc, EngineShutDownError) else "error"
                self.engine.abort(request_id, outcome)
            except Exception:  # pragma: no cover - best effort after a failure
                logger.exception("abort of %s failed", request_id)
            outbox.setdefault(loop, []).append((queue, exc))
        self._sinks.clear()

    def _deliver(self, outbox: Outbox) -> None:
        self._handover.deliver(outbox, self._abort_unheard)

    def _abort_unheard(self, items: list[tuple[DeltaSink, Any]]) -> None:
        """The caller's loop is closed: nobody is listening, stop the work."""
        for _sink, item in items:
            if isinstance(item, StreamDelta) and not item.request_finished:
                self.engine.abort(item.request_id)

    def _wait_for_loops(self, limit: float) -> bool:
        return self._handover.wait(limit)
