"""The usage log: one ApiRequest row per authenticated API call.

Rows are written from a background task on a worker thread of their own, so a client
that hangs up (and cancels the request's task) still gets its request counted, and no
response waits on the database. The rows that finish while a write runs wait for it and go
in the next one, together: a thousand concurrent calls cost a few inserts, not a thousand.
The writer's connection lasts (``conversations.ops.db_thread``), so a write costs no connect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from django.db import close_old_connections, connection
from django.utils import timezone

from conversations.models import ApiKey, ApiRequest
from conversations.ops.db_thread import connections_last, keep_connections
from conversations.usage import record as usage_record

log = logging.getLogger(__name__)

_pending: set[asyncio.Task] = set()
# Per event loop: the rows waiting for its writer task (present while that task runs).
_batches: dict[asyncio.AbstractEventLoop, list[dict[str, Any]]] = {}

_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-usage", initializer=keep_connections)

# Status recorded when the client disconnected before the answer was complete (nginx's).
CLIENT_CLOSED = 499


@dataclass
class RequestLog:
    key: ApiKey
    endpoint: str
    started: float = field(default_factory=time.monotonic)
    model: str = ""
    stream: bool = False
    request_id: str = ""
    recorded: bool = False

    def finish(
        self,
        status: int,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        cached_tokens: int = 0,
        finish_reason: str = "",
        error: str = "",
    ) -> None:
        """Record this call once; later calls are ignored."""
        if self.recorded:
            return
        self.recorded = True
        row = {
            "key_id": self.key.pk,
            "owner_id": self.key.owner_id,
            "request_id": self.request_id[:64],
            "endpoint": self.endpoint[:64],
            "model": self.model[:200],
            "status_code": status,
            "stream": self.stream,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
            "finish_reason": finish_reason[:32],
            "error": error[:2000],
            "duration_ms": (time.monotonic() - self.started) * 1000,
        }
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called from sync code: write now
            _write([row])
            return
        batch = _batches.get(loop)
        if batch is not None:  # the loop's writer takes it on its next round
            batch.append(row)
            return
        _batches[loop] = [row]
        task = loop.create_task(_drain(loop))
        _pending.add(task)
        task.add_done_callback(_pending.discard)


async def _drain(loop: asyncio.AbstractEventLoop) -> None:
    try:
        while rows := _batches[loop]:
            _batches[loop] = []
            await loop.run_in_executor(_writer, _write, rows)
    finally:
        _batches.pop(loop, None)


def _write(rows: list[dict[str, Any]]) -> None:
    close_old_connections()
    try:
        ApiRequest.objects.bulk_create([ApiRequest(**row) for row in rows])
        for row in rows:
            if row["status_code"] == 200 and row["endpoint"].endswith("completions"):
                usage_record.add(
                    usage_record.Finished(
                        user_id=row["owner_id"],
                        model=row["model"],
                        source="api",
                        prompt_tokens=row["prompt_tokens"],
                        completion_tokens=row["completion_tokens"],
                        cached_tokens=row["cached_tokens"],
                        ttft_ms=None,  # the chat's answers carry the figure; API calls do not time it
                    )
                )
        keys = {row["key_id"] for row in rows}
        ApiKey.objects.filter(pk__in=keys).update(last_used_at=timezone.now())
    except Exception:
        log.exception("could not record %d API request(s)", len(rows))
    finally:
        if not connections_last():  # a thread outside any request: nothing else would close it
            connection.close()


async def wait_for_pending() -> None:
    """Tests and shutdown: let the queued usage rows land."""
    if _pending:
        await asyncio.gather(*list(_pending), return_exceptions=True)
