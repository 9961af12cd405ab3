"""Which tools a user's conversation is offered, and where each one runs.

The servers are the enabled ``McpServer`` rows the user may use (open to all, or granted to
the user or one of their groups). Each server's tool list is cached for
``TOOL_LIST_CACHE_SECONDS`` (keyed by the row and its last change); a server that cannot be
listed is left out of that answer with a log line, never failing it. The user's permission
is read again for every call (``route``), so a server taken away stops working at once.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass, field

from channels.db import database_sync_to_async

from conversations.models import McpServer
from conversations.tools.builtin_server import USER_ENV
from conversations.tools.client import ServerSpec, ToolInfo, ToolServerError, list_tools

log = logging.getLogger(__name__)

TOOL_LIST_CACHE_SECONDS = 60.0
BUILTIN_MODULE = "conversations.tools.builtin_server"

_listings: dict[tuple[int, str], tuple[float, list[ToolInfo]]] = {}


@dataclass
class ToolSet:
    tools: list[dict] = field(default_factory=list)  # OpenAI-shaped, as the prompt offers them
    # offered name -> (server id, the server's spec, the tool's name on that server)
    routes: dict[str, tuple[int, ServerSpec, str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.tools)


def server_spec(server: McpServer, user_id: int) -> ServerSpec:
    """How to reach ``server`` on behalf of ``user_id``. The built-in server runs this
    site's module with the site's environment and the user's id, which the model never sets."""
    timeout = float(server.timeout_seconds)
    if server.transport == McpServer.Transport.BUILTIN:
        env = {**os.environ, USER_ENV: str(int(user_id))}
        args = ("-m", BUILTIN_MODULE)
        return ServerSpec(server.name, "stdio", sys.executable, args, tuple(env.items()), timeout=timeout)
    if server.transport == McpServer.Transport.HTTP:
        return ServerSpec(server.name, "http", url=server.url, timeout=timeout)
    env = tuple((str(k), str(v)) for k, v in (server.env or {}).items())
    return ServerSpec(
        server.name, "stdio", server.command, tuple(map(str, server.args or ())), env, timeout=timeout
    )


def _servers(user_id: int) -> list[tuple[int, str, ServerSpec]]:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(pk=user_id).first()
    servers = []
    for server in McpServer.usable_by(user):
        if not server.usable_now():
            log.warning("MCP server %s left out: its URL is not under MCP_HTTP_ALLOWED_URLS", server.name)
            continue
        servers.append((server.pk, server.updated_at.isoformat(), server_spec(server, user_id)))
    return servers


async def _listing(server_id: int, version: str, spec: ServerSpec) -> list[ToolInfo]:
    key = (server_id, version)
    cached = _listings.get(key)
    if cached is not None and time.monotonic() - cached[0] < TOOL_LIST_CACHE_SECONDS:
        return cached[1]
    tools = await list_tools(spec)
    _listings[key] = (time.monotonic(), tools)
    return tools


def _offered_name(taken: dict, server_name: str, tool_name: str) -> str:
    if tool_name not in taken:
        return tool_name
    return re.sub(r"[^A-Za-z0-9_-]+", "_", f"{server_name}__{tool_name}")[:64]


async def toolset_for(user_id: int) -> ToolSet:
    """The tools ``user_id`` may use now, from every server they are allowed."""
    toolset = ToolSet()
    for server_id, version, spec in await database_sync_to_async(_servers)(user_id):
        try:
            tools = await _listing(server_id, version, spec)
        except ToolServerError as exc:
            log.warning("MCP server left out of this answer: %s", exc)
            continue
        for tool in tools:
            name = _offered_name(toolset.routes, spec.name, tool.name)
            toolset.routes[name] = (server_id, spec, tool.name)
            toolset.tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": tool.description,
                        "parameters": tool.parameters or {"type": "object", "properties": {}},
                    },
                }
            )
    return toolset


async def route(user_id: int, offered_name: str) -> tuple[ServerSpec, str] | None:
    """Where the tool the model called runs, if the user may still use it (read afresh)."""
    toolset = await toolset_for(user_id)
    target = toolset.routes.get(offered_name)
    return (target[1], target[2]) if target is not None else None
