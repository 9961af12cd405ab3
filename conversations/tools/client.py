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


def _client(spec: ServerSpec):
    from mcp import Client, StdioServerParameters

    if spec.transport == "http":
        return Client(spec.url)
    return Client(StdioServerParameters(command=spec.command, args=list(spec.args), env=dict(spec.env)))


async def list_tools(spec: ServerSpec) -> list[ToolInfo]:
    """The server's tools; raises :class:`ToolServerError` when it cannot be listed in time."""
    import asyncio

    try:
        async with asyncio.timeout(spec.timeout), _client(spec) as client:
            listed = await client.list_tools()
    except TimeoutError:
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
    try:
        async with asyncio.timeout(spec.timeout), _client(spec) as client:
            result = await client.call_tool(name, arguments)
        text, is_error = result_text(result), bool(result.is_error)
    except TimeoutError:
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
