"""Compiles grammars in worker processes (``CompilePool``), off the engine step's critical
path, with a cache keyed by the spec's hash (the same schema compiles once). A compile still
running after ``time_limit`` seconds is killed with its process and fails; a failure is
cached like a success, so the same grammar fails again at once."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import torch

from inference.structured.compile_pool import CompilePool, GrammarBusyError, PoolClosedError
from inference.structured.compile_worker import GrammarError
from inference.structured.spec import GrammarSpec

__all__ = ["CompiledGrammar", "GrammarBusyError", "GrammarCompiler", "GrammarError", "PoolClosedError"]

# Kinds whose text is JSON only: no raw control character is ever valid in them.
_JSON_KINDS = ("json_schema", "json_object")


@dataclass(frozen=True)
class CompiledGrammar:
    grammar: Any  # xgrammar.CompiledGrammar
    # Packed token bitmask (int32 words, xgrammar's layout) ANDed into the grammar's own, or
    # None. xgrammar (0.2.x) lets raw control characters into JSON strings that have
    # minLength/maxLength, which is not JSON; these bits keep such tokens out.
    keep: torch.Tensor | None = None


class GrammarCompiler:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        *,
        max_workers: int = 2,
        max_queue: int = 16,
        max_per_owner: int = 2,
        time_limit: float | None = 10.0,
        cache_size: int = 512,
    ) -> None:
        """``tokenizer``: ``inference.tokenizer.Tokenizer``; ``vocab_size``: the model's
        (its logits' width, which may exceed the tokenizer's). The pool's bounds: see
        ``CompilePool``."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Future[Any]] = OrderedDict()
        self._info: Any = None  # xgrammar.TokenizerInfo, built on first use
        self._info_lock = threading.Lock()  # apart from the cache's: building it takes seconds
        self._keep: dict[str, torch.Tensor] = {}  # "json" / "text": tokens free of control bytes
        self._pool = CompilePool(
            lambda: self._tokenizer_info().serialize_json(),
            self._finish,
            workers=max_workers,
            max_queue=max_queue,
            max_per_owner=max_per_owner,
            time_limit=time_limit,
        )
        self.hits = 0
        self.misses = 0
        self.compile_seconds: list[float] = []  # per cold compile, for benchmarks

    @property
    def pool(self) -> CompilePool:
        return self._pool

    def submit(self, spec: GrammarSpec, owner: str | None = None, *, bounded: bool = False) -> Future[Any]:
        """A future of the compiled grammar, shared with every earlier submit of an equal
        spec. ``bounded``: a new compile may be refused with ``GrammarBusyError`` (the
        queue, or ``owner``'s share of it, is full)."""
        with self._lock:
            future = self._cache.get(spec.key)
            if future is not None and not future.cancelled():
                self._cache.move_to_end(spec.key)
                self.hits += 1
                return future
            self.misses += 1
            started = time.perf_counter()
            future = self._pool.submit(spec.kind, spec.source, owner, bounded=bounded)
            future.add_done_callback(lambda f: self._timed(f, started))
            self._cache[spec.key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return future

    def compile(self, spec: GrammarSpec, timeout: float | None = None, owner: str | None = None) -> Any:
        """The compiled grammar; ``GrammarError`` if it does not compile (within ``timeout``
        of compiling, after at most ``timeout`` in the queue: ``CompilePool.wait``),
        ``GrammarBusyError`` when the queue or ``owner``'s share is full. A caller that
        stops waiting cancels the compile if it has not started yet."""
        future = self.submit(spec, owner, bounded=True)
        try:
            return future.result() if timeout is None else self._pool.wait(future, timeout)
        except FutureTimeout as exc:
            raise GrammarError(f"the grammar did not compile within {timeout:g} s") from exc
        except CancelledError as exc:
            raise GrammarError("the grammar's compile was cancelled; try again") from exc

    def prepare(self) -> None:
        """Build xgrammar's tokenizer data and start a worker now (blocking: seconds), not at
        the first grammar, which may come while streams run (``CompilePool.prepare``)."""
        self._pool.prepare()

    def close(self) -> None:
        self._pool.close()

    # ---- the parent's side of a compile ------------------------------------------------
    def _tokenizer_info(self) -> Any:
        with self._info_lock:
            if self._info is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer.hf,
                    vocab_size=self.vocab_size,
                    stop_token_ids=list(self.tokenizer.eos_token_ids),
                )
                # JSON: no control byte at all (compact JSON has no free whitespace); other
                # grammars (tool-call tags) keep newlines, which their layout uses.
                self._keep = {
                    "json": _control_free_bits(info.decoded_vocab, self.vocab_size, set()),
                    "text": _control_free_bits(info.decoded_vocab, self.vocab_size, {0x0A}),
                }
                self._info = info
            return self._info

    def _finish(self, kind: str, serialized: str) -> CompiledGrammar:
        """A worker's serialised grammar, with this tokenizer's data and the kind's mask."""
        import xgrammar as xgr

        compiled = xgr.CompiledGrammar.deserialize_json(serialized, self._tokenizer_info())
        if kind in _JSON_KINDS:
            return CompiledGrammar(compiled, self._keep["json"])
        return CompiledGrammar(compiled, self._keep["text"] if kind == "structural_tag" else None)

    def _timed(self, future: Future[Any], started: float) -> None:
        if not future.cancelled() and future.exception() is None:
            self.compile_seconds.append(time.perf_counter() - started)


def _control_free_bits(decoded_vocab: list[bytes], vocab_size: int, allowed: set[int]) -> torch.Tensor:
    """Packed bitmask of the tokens whose bytes hold no control character but ``allowed``."""
    ok = torch.ones(((vocab_size + 31) // 32) * 32, dtype=torch.bool)
    for token, text in enumerate(decoded_vocab[:vocab_size]):
        if any(b < 0x20 and b not in allowed for b in text):
            ok[token] = False
    words = (ok.view(-1, 32).to(torch.int64) << torch.arange(32)).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
