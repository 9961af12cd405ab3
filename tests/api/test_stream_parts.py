"""Each part of a streamed response goes out as ASGI messages in order: a part that fits one
message as it is, a larger one in Django's chunk size."""

from __future__ import annotations

from conversations.ops.asgi_handler import SiteASGIHandler


def test_a_part_that_fits_one_message_is_sent_whole():
    assert list(SiteASGIHandler.chunk_bytes(b"data: {}\n\n")) == [(b"data: {}\n\n", True)]


def test_a_part_larger_than_a_message_is_split_in_order():
    size = SiteASGIHandler.chunk_size
    part = bytes(range(256)) * (2 * size // 256 + 1)
    chunks = list(SiteASGIHandler.chunk_bytes(part))
    assert b"".join(c for c, _ in chunks) == part
    assert [len(c) for c, _ in chunks[:-1]] == [size, size]
    assert [last for _, last in chunks] == [False, False, True]


def test_an_empty_part_is_one_empty_last_message():
    assert list(SiteASGIHandler.chunk_bytes(b"")) == [(b"", True)]
