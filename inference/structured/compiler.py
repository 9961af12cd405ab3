"""Compiles grammars in a thread pool, off the engine step's critical path, with a cache
keyed by the spec's hash (the same schema compiles once)."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import torch

from inference.structured.spec import GrammarSpec

# Kinds whose text is JSON only: no raw control character is ever valid in them.
_JSON_KINDS = ("json_schema", "json_object")


class GrammarError(ValueError):
    """A grammar that cannot be compiled (bad schema, regex or EBNF) or that did not
    compile in time."""


@dataclass(frozen=True)
class CompiledGrammar:
    grammar: Any  # xgrammar.CompiledGrammar
    # Packed token bitmask (int32 words, xgrammar's layout) ANDed into the grammar's own, or
    # None. xgrammar (0.2.x) lets raw control characters into JSON strings that have
    # minLength/maxLength, which is not JSON; these bits keep such tokens out.
    keep: torch.Tensor | None = None


class GrammarCompiler:
    def __init__(
        self, tokenizer: Any, vocab_size: int, *, max_threads: int = 2, cache_size: int = 512
    ) -> None:
        """``tokenizer``: ``inference.tokenizer.Tokenizer``; ``vocab_size``: the model's
        (its logits' width, which may exceed the tokenizer's)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="grammar")
        self._max_threads = max_threads
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Future[Any]] = OrderedDict()
        self._xgr_compiler: Any = None
        self._keep: dict[str, torch.Tensor] = {}  # "json" / "text": tokens free of control bytes
        self.hits = 0
        self.misses = 0
        self.compile_seconds: list[float] = []  # per cold compile, for benchmarks

    def submit(self, spec: GrammarSpec) -> Future[Any]:
        """A future of the compiled grammar, shared with every earlier submit of an equal spec."""
        with self._lock:
            future = self._cache.get(spec.key)
            if future is not None:
                self._cache.move_to_end(spec.key)
                self.hits += 1
                return future
            self.misses += 1
            future = self._pool.submit(self._compile, spec)
            self._cache[spec.key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return future

    def compile(self, spec: GrammarSpec, timeout: float | None = None) -> Any:
        """The compiled grammar; ``GrammarError`` if it does not compile (within ``timeout``)."""
        future = self.submit(spec)
        try:
            return future.result(timeout)
        except FutureTimeout as exc:
            raise GrammarError(f"the grammar did not compile within {timeout:g} s") from exc

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- in the pool ----------------------------------------------------------------
    def _compiler(self) -> Any:
        with self._lock:
            if self._xgr_compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer.hf,
                    vocab_size=self.vocab_size,
                    stop_token_ids=list(self.tokenizer.eos_token_ids),
                )
                # Our own cache sits in front; xgrammar's would keep a second copy.
                self._xgr_compiler = xgr.GrammarCompiler(
                    info, max_threads=self._max_threads, cache_enabled=False
                )
                # JSON: no control byte at all (compact JSON has no free whitespace); other
                # grammars (tool-call tags) keep newlines, which their layout uses.
                self._keep = {
                    "json": _control_free_bits(info.decoded_vocab, self.vocab_size, set()),
                    "text": _control_free_bits(info.decoded_vocab, self.vocab_size, {0x0A}),
                }
            return self._xgr_compiler

    def _compile(self, spec: GrammarSpec) -> Any:
        compiler = self._compiler()
        started = time.perf_counter()
        try:
            compiled = _compile_kind(compiler, spec)
        except GrammarError:
            raise
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError variants
            raise GrammarError(f"invalid {spec.kind.replace('_', ' ')}: {_first_line(exc)}") from exc
        self.compile_seconds.append(time.perf_counter() - started)
        if spec.kind in _JSON_KINDS:
            return CompiledGrammar(compiled, self._keep["json"])
        return CompiledGrammar(compiled, self._keep["text"] if spec.kind == "structural_tag" else None)


def _compile_kind(compiler: Any, spec: GrammarSpec) -> Any:
    if spec.kind == "json_schema":
        try:
            json.loads(spec.source)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from exc
        # Compact JSON: with free whitespace a sampled model can pad until max_tokens.
        return compiler.compile_json_schema(spec.source, any_whitespace=False, strict_mode=True)
    if spec.kind == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
    if spec.kind == "regex":
        return compiler.compile_regex(spec.source)
    if spec.kind == "choice":
        choices = json.loads(spec.source)
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise GrammarError("choices must be a non-empty list of non-empty strings")
        return compiler.compile_grammar("root ::= " + " | ".join(_ebnf_string(c) for c in choices))
    if spec.kind == "ebnf":
        return compiler.compile_grammar(spec.source)
    return compiler.compile_structural_tag(spec.source)


def _control_free_bits(decoded_vocab: list[bytes], vocab_size: int, allowed: set[int]) -> torch.Tensor:
    """Packed bitmask of the tokens whose bytes hold no control character but ``allowed``."""
    ok = torch.ones(((vocab_size + 31) // 32) * 32, dtype=torch.bool)
    for token, text in enumerate(decoded_vocab[:vocab_size]):
        if any(b < 0x20 and b not in allowed for b in text):
            ok[token] = False
    words = (ok.view(-1, 32).to(torch.int64) << torch.arange(32)).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _ebnf_string(text: str) -> str:
    """An EBNF string literal (JSON's escapes, which xgrammar's EBNF reads)."""
    return json.dumps(text, ensure_ascii=False)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
