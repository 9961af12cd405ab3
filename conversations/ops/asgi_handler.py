"""Django's ASGI handler, without the reference cycle it leaves behind every request.

Django's ``ASGIHandler.handle`` runs the view and a ``listen_for_disconnect`` task side by
side; when the client hangs up (every streamed response ends so: the client closes the
connection), that task raises ``RequestAborted``, and ``handle`` re-raises it through its own
frame. The exception's traceback then holds ``handle``'s frame, whose ``tasks`` hold the
exception: a cycle that keeps the request, its response, its engine request and everything
they hold (about 150 objects per request) until a full garbage collection. Under load those
collections paused the event loop and the engine for up to half a second every few seconds,
the worst of every stream's token delays.

Here the listener returns on ``http.disconnect`` instead of raising. ``handle`` treats both the
same way (it cancels the view's task if it still runs and sends ``request_finished``), so
nothing changes but the garbage.

A part of a streamed response that fits one ASGI message is sent as it is, without the
generator Django's ``chunk_bytes`` makes for each part.
"""

from __future__ import annotations

from typing import Any

import django
from django.core.handlers.asgi import ASGIHandler


class SiteASGIHandler(ASGIHandler):
    async def listen_for_disconnect(self, receive: Any) -> None:
        message = await receive()
        if message["type"] != "http.disconnect":
            # As Django's: no other message may follow the body.
            raise AssertionError(f"Invalid ASGI message after request body: {message['type']}")

    @classmethod
    def chunk_bytes(cls, data: bytes) -> Any:
        # A streamed response sends every part through here: a part that fits one message
        # (every SSE write) skips the generator.
        if 0 < len(data) <= cls.chunk_size:
            return ((data, True),)
        return super().chunk_bytes(data)


def site_asgi_application() -> SiteASGIHandler:
    """``django.core.asgi.get_asgi_application`` with this handler."""
    django.setup(set_prefix=False)
    return SiteASGIHandler()
