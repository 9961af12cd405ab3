"""Plain text messages get the frame Autobahn would have sent, written at once; every other
case (compression, a queued write, binary) goes Autobahn's way."""

from __future__ import annotations

import base64
import os

import pytest
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.compress import PerMessageDeflateOffer, PerMessageDeflateOfferAccept
from daphne.ws_protocol import WebSocketProtocol as DaphneProtocol
from twisted.internet.testing import StringTransport

from chatsite import websocket_frames


class Protocol(WebSocketServerProtocol):
    """Autobahn's server protocol with Daphne's send (what Daphne's own protocol runs)."""

    client_addr = None
    serverSend = websocket_frames._autobahn_send  # noqa: N815 - Daphne's name


def open_protocol(deflate: bool = False) -> tuple[Protocol, StringTransport]:
    factory = WebSocketServerFactory("ws://localhost:9000")
    if deflate:

        def accept(offers):
            for offer in offers:
                if isinstance(offer, PerMessageDeflateOffer):
                    return PerMessageDeflateOfferAccept(offer)
            return None

        factory.setProtocolOptions(perMessageCompressionAccept=accept)
    factory.protocol = Protocol
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    key = base64.b64encode(os.urandom(16))
    extensions = b"Sec-WebSocket-Extensions: permessage-deflate\r\n" if deflate else b""
    protocol.dataReceived(
        b"GET / HTTP/1.1\r\nHost: localhost:9000\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n" + extensions + b"\r\n"
    )
    assert protocol.state == protocol.STATE_OPEN
    transport.clear()
    return protocol, transport


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
def test_a_plain_text_message_is_the_frame_autobahn_sends(size):
    text = ("é" * size)[: max(0, size // 2)] + "x" * (size - max(0, size // 2) * 2)
    ours, our_wire = open_protocol()
    theirs, their_wire = open_protocol()
    websocket_frames.server_send(ours, text)
    websocket_frames._autobahn_send(theirs, text)
    assert our_wire.value() == their_wire.value()
    for name in (
        "outgoingWebSocketMessages",
        "outgoingOctetsAppLevel",
        "outgoingOctetsWebSocketLevel",
        "outgoingWebSocketFrames",
        "outgoingOctetsWireLevel",
    ):
        assert getattr(ours.trafficStats, name) == getattr(theirs.trafficStats, name), name


def test_a_compressed_connection_goes_autobahns_way():
    protocol, wire = open_protocol(deflate=True)
    assert protocol._perMessageCompress is not None
    websocket_frames.server_send(protocol, "hello " * 50)
    frame = wire.value()
    assert frame[0] == 0xC1  # FIN, RSV1 (compressed), text
    assert len(frame) < 300


def test_a_message_behind_a_queued_write_waits_its_turn():
    protocol, wire = open_protocol()
    # A write Autobahn queued for the reactor's next turn (a chopped or synchronous send).
    protocol.send_queue.append((b"queued", True))
    protocol.triggered = True
    websocket_frames.server_send(protocol, "after")
    assert wire.value() == b""  # nothing jumped the queue
    assert [data for data, _ in protocol.send_queue] == [b"queued", b"\x81\x05after"]


def test_install_replaces_daphnes_send():
    websocket_frames.install()
    assert DaphneProtocol.serverSend is websocket_frames.server_send
