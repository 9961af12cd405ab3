"""The zero-cost model of ``bench_serving``: an ``ENGINE_LOADER`` whose every token predicts
the same word, so a server's CPU time is all serving path (scheduler, sampler, detokenizer,
web layer), none of it model.

The logits are a narrow ``[rows, LOGITS_WIDTH]`` tensor holding the word's id: on a GPU the
sampler's vocabulary-wide math runs on the device, and costs the CPU a few kernel launches
per step whatever the batch, so a 49k-wide row per token would measure the CPU's memory
bandwidth, not the serving path.

Tracing, for the benchmark's latency figure (no change to the engine): the model records the
engine thread's id and the time of every step's sampling (``compute_logits``); the wrapped
``EngineMetrics.observe_finished`` (once per request) records when each request's first token
was sampled; a ``gc.callbacks`` probe records every garbage collection; the wrapped Daphne
``handle_reply`` of HTTP responses and websockets records, after each write of an SSE body or a
websocket frame to its transport, its time and payload, which the dump reads into the number
of words written per request id (SSE) or message id (websocket): the server-side end of the
token-to-socket delay. ``BENCH_SERVING_TRACE`` names a
directory; whenever the benchmark creates ``dump-request`` there, a small thread writes
``trace.json`` (and removes the request).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import re
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from inference.models.registry import read_model_config

WORD = " the"  # one token in SmolLM2's vocabulary
LOGITS_WIDTH = 512  # the word's id (260) lies inside

_steps: list[float] = []  # monotonic time of each step's sampling
_first_tokens: dict[str, float] = {}  # request id -> monotonic time its first token was sampled
_threads: dict[str, int] = {}
_writes: dict[str, list[tuple[float, int]]] = {}  # stream key -> (time written, words)
_raw_writes: deque[tuple[float, Any]] = deque()  # (time written, SSE body or websocket text)
_collections: list[tuple[float, float, int]] = []  # garbage collections: (start, seconds, generation)
SSE_ID = re.compile(rb'"id":\s*"([^"]+)"')
DELTA_ID = re.compile(r'"type":\s*"delta".*?"message_id":\s*(\d+)|"message_id":\s*(\d+).*?"type":\s*"delta"')


def repeat_word_model() -> tuple[Any, Any, Any]:
    """``load_model``'s triple: SmolLM2's tokenizer and chat template, and a model that answers
    every prompt with ``WORD`` forever (no EOS: answers end at ``max_tokens``)."""
    from transformers import AutoTokenizer

    from inference.tokenizer import Tokenizer
    from tests.support.fakes import ScriptedModel, smollm2_tokenizer_dir, tiny_hf_config

    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
    (word,) = tokenizer.encode(WORD)
    assert word < LOGITS_WIDTH
    config = dataclasses.replace(read_model_config(tiny_hf_config("llama")), name="repeat-word")

    class RepeatWordModel(ScriptedModel):
        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            if not _threads:
                _threads["engine"] = threading.get_native_id()
            _steps.append(time.monotonic())
            logits = torch.zeros(hidden.shape[0], LOGITS_WIDTH)
            logits[:, word] = 100.0
            return logits

    model = RepeatWordModel(config, {}, tokenizer.eos_token_ids[0])
    _trace_first_tokens()
    _trace_writes()
    _trace_collections()
    trace_dir = os.environ.get("BENCH_SERVING_TRACE")
    if trace_dir:
        threading.Thread(target=_dump_on_request, args=(Path(trace_dir),), daemon=True).start()
    return model, tokenizer, config


def _trace_first_tokens() -> None:
    from inference.engine.metrics import EngineMetrics

    observe = EngineMetrics.observe_finished

    def observe_finished(self: EngineMetrics, request: Any) -> None:
        if request.first_token_time is not None:
            _first_tokens[request.request_id] = request.first_token_time
        observe(self, request)

    EngineMetrics.observe_finished = observe_finished  # type: ignore[method-assign]


def _trace_writes() -> None:
    """Record each write as it happens (its time and the message's payload, nothing more: the
    records are read at dump time, so that tracing adds little to the event loop's cost)."""
    from daphne.http_protocol import WebRequest
    from daphne.ws_protocol import WebSocketProtocol

    http_reply, ws_reply = WebRequest.handle_reply, WebSocketProtocol.handle_reply
    record, now = _raw_writes.append, time.monotonic

    def http_handle_reply(self: Any, message: dict) -> None:
        http_reply(self, message)
        if message["type"] == "http.response.body":
            record((now(), message.get("body")))

    def ws_handle_reply(self: Any, message: dict) -> None:
        ws_reply(self, message)
        if message["type"] == "websocket.send":
            record((now(), message.get("text")))

    WebRequest.handle_reply = http_handle_reply  # type: ignore[method-assign]
    WebSocketProtocol.handle_reply = ws_handle_reply  # type: ignore[method-assign]


def _parse_writes() -> None:
    """Move the raw write records into ``_writes``: per stream, (time written, words)."""
    word_bytes = WORD.encode()
    while _raw_writes:
        at, payload = _raw_writes.popleft()
        if isinstance(payload, bytes):
            count = payload.count(word_bytes)
            found = SSE_ID.search(payload) if count else None
            if found:
                _writes.setdefault(found.group(1).decode(), []).append((at, count))
        elif payload and '"delta"' in payload:
            found = DELTA_ID.search(payload)
            if found:
                key = f"ws:{found.group(1) or found.group(2)}"
                _writes.setdefault(key, []).append((at, payload.count(WORD)))


def _trace_collections() -> None:
    """Every garbage collection's start, length and generation: a collection pauses every
    thread of the process while it runs."""
    started: list[float] = [0.0]

    def observe(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.monotonic()
        else:
            _collections.append((started[0], time.monotonic() - started[0], info["generation"]))

    gc.callbacks.append(observe)


def _dump_on_request(trace_dir: Path) -> None:
    request = trace_dir / "dump-request"
    while True:
        time.sleep(0.2)
        if not request.exists():
            continue
        _parse_writes()
        body = {
            "threads": dict(_threads),
            "thread_names": {t.native_id: t.name for t in threading.enumerate()},
            "steps": list(_steps),
            "first_tokens": dict(_first_tokens),
        }
        body["writes"] = {key: list(writes) for key, writes in list(_writes.items())}
        body["collections"] = list(_collections)
        body["names"] = {t.native_id: t.name for t in threading.enumerate()}
        tmp = trace_dir / "trace.json.tmp"
        tmp.write_text(json.dumps(body))
        tmp.rename(trace_dir / "trace.json")
        request.unlink()
