"""Several async iterators read as one, items in the order they come."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any


async def merge_streams(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Items of several async iterators as (stream index, item), as they come."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((i, item, None))
        except Exception as exc:
            queue.put_nowait((i, None, exc))
        finally:
            queue.put_nowait((i, done, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is done:
                remaining -= 1
                continue
            yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
