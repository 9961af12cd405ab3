"""The site's own harmless MCP server: a calculator, the current time, and a search over the
calling user's own conversations. Built with the SDK's ``MCPServer`` (FastMCP in mcp 1.x).

The site starts it over stdio as ``python -m conversations.tools.builtin_server`` for one
user at a time: ``CHATSITE_TOOLS_USER_ID`` in its environment names the user, so the search
can only ever read that user's conversations (``conversations.tools.search``). Tests build
it in process with :func:`build_server`.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from conversations.tools.calculator import CalculatorError, evaluate

USER_ENV = "CHATSITE_TOOLS_USER_ID"


def build_server(user_id: int | None) -> MCPServer:
    server = MCPServer("chatsite-builtin", instructions="Harmless helper tools of this chat site.")

    @server.tool(description="Evaluate an arithmetic expression, e.g. '2 * (3 + 4) ** 2' or 'sqrt(2)'.")
    def calculator(expression: str) -> str:
        try:
            return str(evaluate(expression))
        except CalculatorError as exc:  # the message goes to the model (a crash's would not)
            raise ToolError(str(exc)) from None

    @server.tool(
        description="The current date and time, in UTC or in an IANA time zone such as 'Europe/Paris'."
    )
    def current_time(timezone: str = "UTC") -> str:
        try:
            zone = UTC if timezone in ("", "UTC") else ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown time zone {timezone!r}") from None
        return datetime.now(zone).isoformat(timespec="seconds")

    @server.tool(description="Search the user's own earlier conversations for a word or phrase.")
    async def search_conversations(query: str, limit: int = 5) -> str:
        if user_id is None:
            raise ToolError("this server was started without a user")
        from asgiref.sync import sync_to_async

        from conversations.tools.search import search_conversations as search

        hits = await sync_to_async(search, thread_sensitive=False)(user_id, query, limit)
        return json.dumps(hits, ensure_ascii=False)

    return server


def _user_from_env() -> int | None:
    raw = os.environ.get(USER_ENV, "")
    return int(raw) if raw.isdigit() else None


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    import django

    django.setup()
    build_server(_user_from_env()).run("stdio")


if __name__ == "__main__":
    main()
