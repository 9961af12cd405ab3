"""The load generator of ``bench_serving``, run in a process of its own.

It reads one job per line on stdin (JSON) and answers one JSON line: per stream, its request
id and, per event received, the monotonic arrival time and the number of tokens it carried.
SSE streams use a minimal HTTP/1.1 client on raw sockets (the official client's parsing at
1,024 streams would take the cores from the server it measures); websocket streams use the
``websockets`` library, as the chat's tabs would.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

WORD = " the"
CONNECT_AT_ONCE = 64  # Twisted listens with a short backlog: open connections in waves


async def sse_stream(job: dict[str, Any], connect: asyncio.Semaphore) -> dict[str, Any]:
    body = json.dumps(
        {
            "model": job["model"],
            "messages": [{"role": "user", "content": "Say the word."}],
            "max_tokens": job["tokens"],
            "temperature": job["temperature"],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {job['host']}\r\n"
        f"Authorization: Bearer {job['key']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    async with connect:
        reader, writer = await asyncio.open_connection(job["host"], job["port"], limit=2**22)
    writer.write(head + body)
    headers = await reader.readuntil(b"\r\n\r\n")
    if not headers.startswith(b"HTTP/1.1 200"):
        rest = await reader.read()
        raise RuntimeError(f"SSE request failed: {headers[:200]!r} {rest[:500]!r}")
    chunked = b"chunked" in headers.lower()
    arrivals: list[tuple[float, int]] = []
    request_id, usage, buffer = "", None, b""
    while True:
        if chunked:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                break
            data = (await reader.readexactly(size + 2))[:-2]
        else:
            data = await reader.read(1 << 16)
            if not data:
                break
        now = time.monotonic()
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            payload = event.removeprefix(b"data: ")
            if payload == b"[DONE]":
                continue
            chunk = json.loads(payload)
            request_id = chunk.get("id", request_id)
            if chunk.get("usage") and not chunk["choices"]:
                usage = chunk["usage"]
            count = sum((c.get("delta", {}).get("content") or "").count(WORD) for c in chunk["choices"])
            if count:
                arrivals.append((now, count))
    writer.close()
    return {"request_id": request_id, "arrivals": arrivals, "usage": usage}


@dataclass
class Tabs:
    """Where the tabs of a job are: how many have their thread shown, and the signal to ask
    (set at once unless the job opens every tab before any asks: ``open_first``)."""

    count: int
    opened: int = 0
    all_open: asyncio.Event = field(default_factory=asyncio.Event)
    go: asyncio.Event = field(default_factory=asyncio.Event)

    def open(self) -> None:
        self.opened += 1
        if self.opened == self.count:
            self.all_open.set()


async def ws_stream(
    job: dict[str, Any], conversation_id: int, cookie: str, connect: asyncio.Semaphore, tabs: Tabs
) -> dict[str, Any]:
    import websockets

    url = f"ws://{job['host']}:{job['port']}/ws/chat/{conversation_id}/"
    headers = {"Cookie": cookie, "Origin": f"http://{job['host']}"}
    async with connect:
        ws = await websockets.connect(
            url, additional_headers=headers, max_size=None, compression=None, open_timeout=300
        )
    arrivals: list[tuple[float, int]] = []
    message_id, finished = None, None
    try:
        while json.loads(await ws.recv())["type"] != "thread":
            pass
        tabs.open()
        await tabs.go.wait()
        await ws.send(json.dumps({"type": "send", "content": "Say the word."}))
        while finished is None:
            raw = await ws.recv()
            now = time.monotonic()
            event = json.loads(raw)
            kind = event["type"]
            if kind == "delta":
                message_id = event["message_id"]
                count = event["text"].count(WORD)
                if count:
                    arrivals.append((now, count))
            elif kind == "finished":
                finished = event["message"]
            elif kind == "error":
                raise RuntimeError(f"chat error: {event}")
    finally:
        await ws.close()
    return {"message_id": message_id, "arrivals": arrivals, "usage": finished}


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """The job's streams. With ``open_first`` (websocket), every tab connects and shows its
    thread first; then this prints ``{"phase": "open"}`` and waits for a line on stdin before
    every tab asks its question at once (the benchmark reads the server's CPU in between)."""
    connect = asyncio.Semaphore(CONNECT_AT_ONCE)
    start = time.monotonic()
    if job["transport"] == "sse":
        streams = [asyncio.ensure_future(sse_stream(job, connect)) for _ in range(job["streams"])]
    else:
        tabs = Tabs(len(job["conversations"]))
        streams = [
            asyncio.ensure_future(ws_stream(job, cid, cookie, connect, tabs))
            for cid, cookie in job["conversations"]
        ]
        if job.get("open_first"):
            opening = asyncio.ensure_future(tabs.all_open.wait())
            await asyncio.wait([opening, *streams], return_when=asyncio.FIRST_COMPLETED)
            for failed in [s for s in streams if s.done()]:
                failed.result()  # a tab that ended before asking: its error
            print(json.dumps({"phase": "open", "open_s": time.monotonic() - start}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            start = time.monotonic()
        tabs.go.set()
    results = await asyncio.gather(*streams)
    return {"streams": results, "wall_s": time.monotonic() - start, "client_cpu_s": time.process_time()}


def main() -> None:
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps(asyncio.run(run_job(job))), flush=True)


if __name__ == "__main__":
    main()
