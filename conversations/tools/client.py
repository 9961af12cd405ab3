"""Talking to one MCP server with the official SDK: list its tools, call one.

Each operation opens its own session (a stdio server is started for it and stopped after;
an HTTP server gets a fresh connection), bounded as a whole by the server's timeout. A call
never raises for the tool's sake: a timeout, a crash, a refused connection or an error
result all come back as a :class:`ToolResult` with ``is_error`` and a one-line reason, and
its text is cut to a maximum length, so a tool can never break or flood an answer.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class ToolServerError(RuntimeError):
    """A server could not be reached or listed."""


@dataclass(frozen=True)
class ServerSpec:
    """How to reach one server (built from an ``McpServer`` row by ``registry``)."""

    name: str
    transport: str  # "stdio" | "http" (the built-in server is a stdio command)
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    timeout: float = 30.0


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str
    parameters: dict = field(default_factory=dict)  # JSON Schema of the arguments


@dataclass
class ToolResult:
    text: str
    is_error: bool
    duration_ms: float


# Stdio servers running at once in this process: each is a process of its own (the built-in
# one a Python that runs ``django.setup()``), so a burst of calls queues here instead of
# forking without bound. A call that finds no slot within its timeout is an error result.
# Per event loop (weakly: a closed loop's semaphore goes with it, and a new loop never gets
# one bound to another).
_slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _process_slots():
    """This event loop's semaphore of ``CHAT_TOOL_MAX_PROCESSES`` slots (re-made when the
    setting changes)."""
    import asyncio

    from django.conf import settings

    limit = max(1, int(getattr(settings, "CHAT_TOOL_MAX_PROCESSES", 4)))
    key = asyncio.get_running_loop()
    held = _slots.get(key)
    if held is None or held[0] != limit:
        held = _slots[key] = (limit, asyncio.Semaphore(limit))
    return held[1]


class _Session:
    """An MCP client session of ``spec``, opened once a process slot is free (stdio servers
    only; an HTTP server starts no process). ``waited_out``: the timeout came before a slot."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.slots = _process_slots() if spec.transport != "http" else None
        self.client = None
        self.holding = False
        self.waited_out = False

    async def __aenter__(self):
        if self.slots is not None:
            try:
                await self.slots.acquire()
            except BaseException:
                self.waited_out = True
                raise
            self.holding = True
        try:
            self.client = _client(self.spec)
            return await self.client.__aenter__()
        except BaseException:
            self._release()
            raise

    async def __aexit__(self, *exc_info):
        try:
            return await self.client.__aexit__(*exc_info)
        finally:
            self._release()

    def _release(self) -> None:
        if self.holding:
            self.holding = False
            self.slots.release()


def _busy(spec: ServerSpec) -> str:
    from django.conf import settings

    limit = max(1, int(getattr(settings, "CHAT_TOOL_MAX_PROCESSES", 4)))
    return (
        f"the site already runs {limit} tool processes, the most allowed, and none finished "
        f"within {spec.timeout:g} s: try again later"
    )


def _client(spec: ServerSpec):
    from mcp import Client, StdioServerParameters

    if spec.transport == "http":
        return Client(spec.url)
    return Client(StdioServerParameters(command=spec.command, args=list(spec.args), env=dict(spec.env)))


async def list_tools(spec: ServerSpec) -> list[ToolInfo]:
    """The server's tools; raises :class:`ToolServerError` when it cannot be listed in time."""
    import asyncio

    session = _Session(spec)
    try:
        async with asyncio.timeout(spec.timeout), session as client:
            listed = await client.list_tools()
    except TimeoutError:
        if session.waited_out:
            raise ToolServerError(f"{spec.name}: {_busy(spec)}") from None
        raise ToolServerError(f"{spec.name}: no tool list within {spec.timeout:g} s") from None
    except Exception as exc:
        raise ToolServerError(f"{spec.name}: {_reason(exc)}") from exc
    return [
        ToolInfo(name=t.name, description=t.description or "", parameters=dict(t.input_schema or {}))
        for t in listed.tools
    ]


async def call_tool(spec: ServerSpec, name: str, arguments: dict[str, Any], *, max_chars: int) -> ToolResult:
    """Call tool ``name``; whatever happens (but cancellation) the model gets a result."""
    import asyncio

    started = time.monotonic()
    session = _Session(spec)
    try:
        async with asyncio.timeout(spec.timeout), session as client:
            result = await client.call_tool(name, arguments)
        text, is_error = result_text(result), bool(result.is_error)
    except TimeoutError:
        if session.waited_out:
            text, is_error = f"Error: the tool {name} was not run: {_busy(spec)}.", True
        else:
            text, is_error = f"Error: the tool {name} did not answer within {spec.timeout:g} seconds.", True
    except Exception as exc:
        log.info("tool %s on %s failed", name, spec.name, exc_info=True)
        text, is_error = f"Error: the tool {name} failed: {_reason(exc)}", True
    return ToolResult(cap_output(text, max_chars), is_error, (time.monotonic() - started) * 1000)


def result_text(result: Any) -> str:
    """A call's result as text for the model: its text blocks, else its structured content."""
    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        else:
            parts.append(f"[{kind or 'content'} left out]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def cap_output(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[output cut at {max_chars} of {len(text)} characters]"


def _reason(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups (anyio's task groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
