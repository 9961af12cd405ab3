"""Refuse oversized request bodies in Daphne, before they are received.

Daphne (Twisted underneath) takes in a request's whole body, into memory or a temporary
file, before it calls the ASGI application: no Django check, middleware or ASGI wrapper
runs until a 1 GB upload has arrived. So the check sits in Daphne's request class, which
Twisted calls when the headers are in (``gotLength``) and for each piece of the body
(``handleContentChunk``): a Content-Length over the limit is answered with a 413 at once,
and a body without one (chunked) is counted as it arrives and cut off at the limit. Either
way the connection then closes, so the rest is never read.

The same class turns off Twisted's own parsing of form bodies (``request.args``, which
Daphne never reads): it would parse an upload a second time, on the event loop.

``install`` is called by ``chatsite.asgi``, which ``daphne`` (and Daphne's ``runserver``)
import before serving.
"""

from __future__ import annotations

import inspect

from daphne import http_protocol
from twisted.web import http

# Newer Twisted releases can be told not to parse form bodies; older ones always do.
CAN_SKIP_FORM_PARSING = "parsePOSTFormSubmission" in inspect.signature(http.Request.__init__).parameters

TEMPLATE = (
    "<!doctype html><html><head><meta charset=utf-8><title>Too large</title></head><body>"
    "<h1>Too large</h1><p>This request is larger than the site accepts ({limit:.3g} MB at most, "
    "an import file included). Nothing was saved.</p></body></html>"
)


class BodyLimitedRequest(http_protocol.WebRequest):
    max_body_bytes: int | None = None

    def __init__(self, *args, **kwargs) -> None:
        if CAN_SKIP_FORM_PARSING:
            kwargs["parsePOSTFormSubmission"] = False
        super().__init__(*args, **kwargs)
        self.body_bytes = 0
        self.refused = False

    def gotLength(self, length: int | None) -> None:  # noqa: N802 (Twisted's name)
        if self.max_body_bytes is not None and length is not None and length > self.max_body_bytes:
            self._refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:  # noqa: N802 (Twisted's name)
        if self.refused:
            return
        self.body_bytes += len(data)
        if self.max_body_bytes is not None and self.body_bytes > self.max_body_bytes:
            self._refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:  # noqa: N802
        if not self.refused:  # a refused request is answered already and never reaches the app
            super().requestReceived(command, path, version)

    def _refuse(self) -> None:
        self.refused = True
        # Twisted would send "100 Continue" after this method returns; the client is not
        # to send the body at all.
        self.requestHeaders.removeHeader(b"Expect")
        body = TEMPLATE.format(limit=self.max_body_bytes / 1_000_000).encode()
        head = (
            "HTTP/1.1 413 Content Too Large\r\n"
            "Content-Type: text/html; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        # Straight to the transport: the request is not complete, so Twisted's response
        # machinery (which waits for it) cannot be used. Closing stops reading at once; a
        # client still sending gets a reset, but has the 413 already (kernels keep data
        # received before a reset for the reader).
        self.channel.transport.write(head + body)
        self.channel.transport.loseConnection()


def install(max_body_bytes: int) -> None:
    """Make Daphne's HTTP factory build :class:`BodyLimitedRequest` (it looks ``WebRequest``
    up in its module each time it builds a connection)."""
    BodyLimitedRequest.max_body_bytes = max_body_bytes
    http_protocol.WebRequest = BodyLimitedRequest
