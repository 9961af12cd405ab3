"""Daphne's websocket text messages, framed in one step.

Daphne hands every message to Autobahn's ``sendMessage``, which checks its arguments,
updates its statistics, decides on compression and fragmentation, then ``sendFrame`` builds
the frame bit by bit and ``sendData`` queues or writes it: about a tenth of the event loop's
time when hundreds of chat answers stream. Most messages take the plainest path: an open
connection, no compression negotiated, no fragmentation, no masking, no frame logging,
nothing queued. For those the frame is a two- to ten-byte header and the UTF-8 payload,
written at once, with the same statistics counted. Every other message (and every binary
one) goes Autobahn's way, unchanged.
"""

from __future__ import annotations

import logging

from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
from daphne.ws_protocol import WebSocketProtocol

_autobahn_send = WebSocketProtocol.serverSend
_daphne_log = logging.getLogger("daphne.ws_protocol")
TEXT_FIN = 0x81  # FIN + opcode 1 (text)


def text_frame(payload: bytes) -> bytes:
    """An unmasked, unfragmented text frame (RFC 6455 §5.2)."""
    size = len(payload)
    if size <= 125:
        return bytes((TEXT_FIN, size)) + payload
    if size <= 0xFFFF:
        return bytes((TEXT_FIN, 126)) + size.to_bytes(2, "big") + payload
    return bytes((TEXT_FIN, 127)) + size.to_bytes(8, "big") + payload


def _plain(protocol: WebSocketProtocol, size: int) -> bool:
    """Whether Autobahn would send this message as one plain frame, written at once."""
    return (
        protocol.state == AutobahnProtocol.STATE_OPEN
        and protocol._perMessageCompress is None
        and not protocol.maskServerFrames
        and not protocol.logFrames
        and not protocol.trackedTimings
        and not protocol.send_queue
        and not (0 < protocol.autoFragmentSize < size)
        and not (0 < protocol.maxMessagePayloadSize < size)
    )


def server_send(self: WebSocketProtocol, content: str | bytes, binary: bool = False) -> None:
    if binary or _daphne_log.isEnabledFor(logging.DEBUG):
        _autobahn_send(self, content, binary)
        return
    payload = content.encode("utf8")  # type: ignore[union-attr]
    size = len(payload)
    if not _plain(self, size):
        _autobahn_send(self, content, binary)
        return
    frame = text_frame(payload)
    stats = self.trafficStats
    stats.outgoingWebSocketMessages += 1
    stats.outgoingOctetsAppLevel += size
    stats.outgoingOctetsWebSocketLevel += size
    stats.outgoingWebSocketFrames += 1
    stats.outgoingOctetsWireLevel += len(frame)
    self.transport.write(frame)


def install() -> None:
    WebSocketProtocol.serverSend = server_send
