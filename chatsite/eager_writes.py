"""Twisted (under Daphne) buffers every write and sends it when the reactor next finds the
socket writable. For a streamed token on an idle socket that means: register the socket
with epoll, a reactor pass, the send, and unregister it again; two ``epoll_ctl`` calls and
a few layers of Python for every SSE chunk and every websocket frame.

Here a plain TCP connection with nothing buffered sends at once, as asyncio's own
transports do. Whatever the kernel does not take (a full socket buffer), and every write
behind it, is buffered and goes the usual way, so the order of the bytes, flow control
(producers paused over the buffer size) and the handling of a lost connection (found by the
reactor's next write attempt) are Twisted's own. TLS connections are left alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from twisted.internet import tcp

_buffered_write = tcp.Connection.write
_buffered_write_sequence = tcp.Connection.writeSequence


def _idle(connection: tcp.Connection) -> bool:
    """Whether bytes written now may go straight to the socket: connected, not closing,
    not TLS, and nothing written earlier still waiting in Twisted's buffers."""
    return (
        not connection.TLS
        and connection.connected
        and not connection.disconnecting
        and not connection._writeDisconnected
        and not connection._tempDataLen
        and connection.offset >= len(connection.dataBuffer)
    )


def _send_now(connection: tcp.Connection, data: bytes) -> bytes:
    """Send what the socket takes at once; returns the rest (all of it after an error,
    which the buffered path then meets and reports as Twisted does)."""
    sent = connection.writeSomeData(data)
    if isinstance(sent, int) and sent > 0:
        return data[sent:]
    return data


def write(self: tcp.Connection, data: bytes) -> None:
    if type(data) is bytes and data and _idle(self):
        data = _send_now(self, data)
        if not data:
            return
    _buffered_write(self, data)


def write_sequence(self: tcp.Connection, iovec: Iterable[bytes]) -> None:
    chunks = list(iovec)
    if chunks and all(type(chunk) is bytes for chunk in chunks) and _idle(self):
        rest = _send_now(self, b"".join(chunks))
        if rest:
            _buffered_write(self, rest)
        return
    _buffered_write_sequence(self, chunks)


def install() -> None:
    tcp.Connection.write = write
    tcp.Connection.writeSequence = write_sequence
