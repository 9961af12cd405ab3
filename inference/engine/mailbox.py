"""One reader's items on its event loop: a request's deltas from the engine thread's
hand-overs, a websocket's events."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Mailbox:
    """``asyncio.Queue``'s ``put_nowait`` and ``get`` for one reader, without what a
    stream never uses (a capacity, task counting, several waiting readers): these run
    for every hand-over of every stream, where the queue's bookkeeping cost the event
    loop more than the rest of the hand-over. Used on its loop's thread only."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # a reader cancelled while waiting leaves a cancelled future
                waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Any:
        # The wait is written out here and in get_all, not shared through a helper
        # coroutine: that would be one more frame to resume for every delta of every stream.
        items = self._items
        while not items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        return items.popleft()

    async def get_all(self) -> list[Any]:
        """Every item there is, waiting for one if there are none."""
        items = self._items
        while not items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        everything = list(items)
        items.clear()
        return everything
