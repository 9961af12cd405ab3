"""Writes on an idle Twisted TCP connection go to the socket at once; anything the kernel
does not take, and everything written behind it, goes through Twisted's buffer in order."""

from __future__ import annotations

import socket

import pytest
from twisted.internet import error, tcp
from twisted.internet.protocol import Protocol

from chatsite import eager_writes


class StubReactor:
    """The reactor calls a connection makes when it starts or stops waiting to write."""

    def __init__(self) -> None:
        self.writers: set = set()
        self.registrations = 0

    def addWriter(self, selectable) -> None:  # noqa: N802 - Twisted's name
        self.registrations += 1
        self.writers.add(selectable)

    def removeWriter(self, selectable) -> None:  # noqa: N802 - Twisted's name
        self.writers.discard(selectable)

    def addReader(self, selectable) -> None:  # noqa: N802 - Twisted's name
        pass

    def removeReader(self, selectable) -> None:  # noqa: N802 - Twisted's name
        pass


@pytest.fixture
def connection():
    eager_writes.install()
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reactor = StubReactor()
    conn = tcp.Connection(ours, Protocol(), reactor)
    conn.connected = True
    yield conn, peer, reactor
    ours.close()
    peer.close()


def read_all(peer: socket.socket, size: int) -> bytes:
    peer.settimeout(2)
    got = b""
    while len(got) < size:
        got += peer.recv(size - len(got))
    return got


def test_a_write_on_an_idle_connection_reaches_the_peer_without_a_reactor_pass(connection):
    conn, peer, reactor = connection
    conn.write(b"data: one\n\n")
    conn.writeSequence([b"5\r\n", b"hello", b"\r\n"])
    assert read_all(peer, 21) == b"data: one\n\n5\r\nhello\r\n"
    assert reactor.registrations == 0


def test_what_the_kernel_does_not_take_is_buffered_and_later_writes_keep_their_order(connection):
    conn, peer, reactor = connection
    big = bytes(range(256)) * 4096  # 1 MiB: far more than the socket buffers hold
    conn.write(big)
    assert conn in reactor.writers  # the rest waits for the reactor
    conn.write(b"after")
    conn.writeSequence([b"and ", b"last"])
    expected = big + b"after" + b"and last"
    received = b""
    peer.settimeout(2)
    while len(received) < len(expected):
        if conn in reactor.writers:
            conn.doWrite()
        try:
            received += peer.recv(65536)
        except TimeoutError:
            break
    assert received == expected
    assert conn not in reactor.writers


def test_a_lost_connection_is_reported_by_twisted_not_by_the_write(connection):
    conn, peer, reactor = connection
    peer.close()
    conn.write(b"x" * 100)  # no exception here: the bytes wait in Twisted's buffer
    assert conn in reactor.writers
    assert isinstance(conn.doWrite(), error.ConnectionLost)  # the reactor then closes it
