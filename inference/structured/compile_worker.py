"""A grammar-compiling worker process (``CompilePool``'s), and the compile itself.

Imports nothing heavy at the top: the parent imports this module for ``GrammarError`` and
the compile rules; only ``serve`` (in the worker) loads xgrammar.
"""

from __future__ import annotations

import ctypes
import json
import signal
from multiprocessing.connection import Connection
from typing import Any

_PR_SET_PDEATHSIG = 1


class GrammarError(ValueError):
    """A grammar that cannot be compiled (bad schema, regex or EBNF) or that did not
    compile in time."""


def serve(conn: Connection) -> None:
    """The worker's loop: the tokenizer data first, then ``(kind, source)`` in,
    ``("ok", serialized)`` or ``("error", message)`` out, until the socket closes."""
    _die_with_parent()
    import xgrammar as xgr  # noqa: PLC0415 - only in the worker

    try:
        info = xgr.TokenizerInfo.deserialize_json(conn.recv())
        conn.send(("ready", ""))  # loading took seconds: the parent's clock starts now
    except (EOFError, OSError):
        return
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    while True:
        try:
            kind, source = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer = ("ok", compile_kind(compiler, kind, source).serialize_json())
        except GrammarError as exc:
            answer = ("error", str(exc))
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError variants
            answer = ("error", f"invalid {kind.replace('_', ' ')}: {first_line(exc)}")
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a server ended by its watchdog
    runs no exit handlers, and a compile could otherwise run on for minutes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pipe's EOF ends the loop after the compile
        pass


def compile_kind(compiler: Any, kind: str, source: str) -> Any:
    """``source`` of ``kind`` compiled by an ``xgrammar.GrammarCompiler``."""
    if kind == "json_schema":
        try:
            json.loads(source)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from exc
        # Compact JSON: with free whitespace a sampled model can pad until max_tokens.
        return compiler.compile_json_schema(source, any_whitespace=False, strict_mode=True)
    if kind == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
    if kind == "regex":
        return compiler.compile_regex(source)
    if kind == "choice":
        choices = json.loads(source)
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise GrammarError("choices must be a non-empty list of non-empty strings")
        return compiler.compile_grammar("root ::= " + " | ".join(ebnf_string(c) for c in choices))
    if kind == "ebnf":
        return compiler.compile_grammar(source)
    return compiler.compile_structural_tag(source)


def ebnf_string(text: str) -> str:
    """An EBNF string literal (JSON's escapes, which xgrammar's EBNF reads)."""
    return json.dumps(text, ensure_ascii=False)


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def main(fd: int) -> None:
    """The worker process's entry point: ``fd`` is its end of the parent's socket pair."""
    serve(Connection(fd))
