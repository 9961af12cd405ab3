"""A misbehaving MCP server for the client's tests, run as ``python -m tests.support.mcp_servers``
(stdio) or with ``--http PORT`` (streamable HTTP at ``/mcp``): ``slow`` sleeps, ``big`` returns a
long text, ``boom`` crashes."""

from __future__ import annotations

import sys
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
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run("stdio")
