"""Answers' final saves, written together.

An answer's final save is one row update behind the fence (``answer_rows``). Answers that
finish close together (a burst of questions asked at once ends in a burst of answers) would
each make a call to the database thread and commit a transaction of their own. Here the
saves asked for while the event loop works through one turn go in one call and one
transaction (``save_finals``), and those asked for while a write is under way go in the
next, right after it: the same rows written, in the same order, with a call and a commit
per burst instead of per answer. Each caller still gets its own row count, or its own error.
"""

from __future__ import annotations

import asyncio
import logging

from conversations.chat.answer_rows import save_finals

log = logging.getLogger(__name__)


class FinalSaves:
    """One event loop's final saves (its thread only)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, dict[str, object], asyncio.Future[int]]] = []
        self._writer: asyncio.Task | None = None  # the write under way, if any
        self._flush_soon = False

    async def save(self, message_id: int, fields: dict[str, object]) -> int:
        """Write the answer's final fields; the rows written (0: no longer this process's)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._waiting.append((message_id, fields, future))
        if self._writer is None and not self._flush_soon:
            self._flush_soon = True
            loop.call_soon(self._flush)  # after this turn's other finishes
        return await future

    def _flush(self) -> None:
        self._flush_soon = False
        if self._waiting and self._writer is None:
            batch, self._waiting = self._waiting, []
            self._writer = asyncio.get_running_loop().create_task(self._write(batch), name="final-saves")

    async def _write(self, batch: list[tuple[int, dict[str, object], asyncio.Future[int]]]) -> None:
        try:
            results: list[int | BaseException] = await save_finals(
                [(message_id, fields) for message_id, fields, _ in batch]
            )
        except asyncio.CancelledError:  # the loop is going away: so are the answers' tasks
            for _, _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            results = [exc] * len(batch)
        finally:
            self._writer = None
        for (_, _, future), result in zip(batch, results, strict=True):
            if future.done():  # its answer's task was cancelled meanwhile
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        self._flush()  # those that came during the write
