"""The server's listen queue holds a burst of connections while its event loop is busy:
with Twisted's default (50) the kernel drops the SYNs past it, and each of those clients
waits a second for its retry (1,024 browser tabs or API clients arriving at once)."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time

import pytest

BURST = 300


def connected_within(sockets: list[socket.socket], seconds: float) -> int:
    """How many of ``sockets`` (connecting, non-blocking) finish their handshake in time."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        selector.register(sock, selectors.EVENT_WRITE)
    done = 0
    deadline = time.monotonic() + seconds
    while done < len(sockets) and (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(left):
            selector.unregister(key.fileobj)
            done += key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    selector.close()
    return done


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_connections_to_a_busy_server_is_queued_not_dropped(live_site) -> None:
    port = int(live_site.url.rsplit(":", 1)[1])
    sockets = []
    os.kill(live_site.process.pid, signal.SIGSTOP)  # busy: accepts nothing meanwhile
    try:
        for _ in range(BURST):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            sockets.append(sock)
        # Well within the first SYN retry (1 s): a dropped SYN has not been answered yet.
        connected = connected_within(sockets, 0.5)
    finally:
        os.kill(live_site.process.pid, signal.SIGCONT)
        for sock in sockets:
            sock.close()
    assert connected == BURST


def test_the_make_and_procfile_servers_listen_with_the_tested_queue() -> None:
    """The live site above starts as ``tests.live_site`` does; the commands people run
    (``make run``, the ``Procfile``'s processes) give Daphne the same listen queue."""
    from tests.live_site import LISTEN_BACKLOG, ROOT

    makefile = (ROOT / "Makefile").read_text()
    procfile = (ROOT / "Procfile").read_text()
    assert f"LISTEN_BACKLOG ?= {LISTEN_BACKLOG}" in makefile
    assert ":backlog=$(LISTEN_BACKLOG) chatsite.asgi:application" in makefile
    assert f":backlog=${{LISTEN_BACKLOG:-{LISTEN_BACKLOG}}} chatsite.asgi:application" in procfile
    assert "daphne -b" not in makefile + procfile
