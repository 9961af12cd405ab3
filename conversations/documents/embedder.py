"""Where embeddings come from: the served model's engine, or ``EMBEDDING_MODEL``.

Both give L2-normalised fp32 rows (``numpy`` arrays here), so a dot product is the
cosine similarity. The engine path runs on the engine thread between steps
(``AsyncEngine.embed``); the encoder path serialises its forwards with a lock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings

from conversations.ops.engine_handle import get_engine

# Seconds a synchronous caller (an extraction job) waits for the engine's embeddings.
EMBED_TIMEOUT_SECONDS = 600.0
QUEUE_FULL_RETRY_SECONDS = 0.5  # its retry interval while the engine's embedding queue is full

_lock = threading.Lock()
_encoder: Any = None


@dataclass
class Embedder:
    """One source of embeddings: ``model_name`` is what ``/v1/embeddings`` answers to."""

    model_name: str
    max_input_tokens: int
    _backend: Any
    _is_engine: bool

    def encode(self, text: str) -> list[int]:
        if self._is_engine:
            return self._backend.tokenizer.encode(text)
        return self._backend.encode(text)

    def tokenizer_json(self) -> str | None:
        """The engine's tokenizer as the tokenizers library's JSON, where ``encode`` is that
        library's own call (so another process encodes alike); else None."""
        rust = getattr(self._backend.tokenizer, "_backend", None) if self._is_engine else None
        return rust.to_str() if rust is not None else None

    @property
    def vocab_size(self) -> int:
        tokenizer = self._backend.tokenizer
        return int(tokenizer.vocab_size) if self._is_engine else len(tokenizer)

    def embed_ids(self, inputs: list[list[int]], owner: str | None = None) -> np.ndarray:
        """Blocking: ``[N, dim]`` float32 rows. ``owner`` (``"user:<id>"``, an API key):
        whose fair share the engine counts the work against. A background caller waits
        for room while the engine's embedding queue is full."""
        if self._is_engine:
            # Here, not at the top: a Celery worker imports this module and no engine code.
            from inference.errors import EngineOverloadedError  # noqa: PLC0415

            deadline = time.monotonic() + EMBED_TIMEOUT_SECONDS
            while True:
                try:
                    future = self._backend.embed_future(inputs, owner)
                    break
                except EngineOverloadedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(QUEUE_FULL_RETRY_SECONDS)
            tensor = future.result(max(1.0, deadline - time.monotonic()))
        else:
            tensor = self._backend.embed(inputs)
        return tensor.numpy().astype(np.float32, copy=False)

    async def aembed_ids(self, inputs: list[list[int]], owner: str | None = None) -> np.ndarray:
        """``EngineOverloadedError`` at once when the engine's embedding queue is full."""
        if self._is_engine:
            tensor = await self._backend.embed(inputs, owner)
            return tensor.numpy().astype(np.float32, copy=False)
        return await asyncio.to_thread(self.embed_ids, inputs)

    def truncate(self, ids: list[int]) -> list[int]:
        """A passage's ids cut to what one input may hold (retrieval's own inputs only)."""
        return ids[: self.max_input_tokens]

    def embed_texts(self, texts: list[str], owner: str | None = None) -> np.ndarray:
        return self.embed_ids([self.truncate(self.encode(t) or [0]) for t in texts], owner)

    async def aembed_texts(self, texts: list[str], owner: str | None = None) -> np.ndarray:
        ids = await asyncio.to_thread(lambda: [self.truncate(self.encode(t) or [0]) for t in texts])
        return await self.aembed_ids(ids, owner)


def _encoder_embedder() -> Embedder:
    global _encoder
    with _lock:
        if _encoder is None:
            from inference.runner.hf_encoder import HFEncoder  # noqa: PLC0415 - only when configured

            _encoder = HFEncoder(settings.EMBEDDING_MODEL)
    return Embedder(_encoder.model_name, _encoder.max_length, _encoder, False)


def get_embedder() -> Embedder:
    """Blocking (may load a model): call it off the event loop."""
    if settings.EMBEDDING_MODEL:
        return _encoder_embedder()
    engine = get_engine()
    return Embedder(engine.model_name, engine.max_model_len - 1, engine, True)


async def aget_embedder() -> Embedder:
    return await asyncio.to_thread(get_embedder)
