"""A misbehaving MCP server for the client's tests, run as ``python -m tests.support.mcp_servers``:
``slow`` sleeps, ``big`` returns a long text, ``boom`` crashes."""

from __future__ import annotations

import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("chatsite-test-tools")


@server.tool()
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "woke up"


@server.tool()
def big(size: int) -> str:
    return "x" * size


@server.tool()
def boom() -> str:
    raise RuntimeError("the tool crashed")


if __name__ == "__main__":
    server.run("stdio")
