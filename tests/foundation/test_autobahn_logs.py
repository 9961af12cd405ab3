"""Autobahn's websocket debug lines: their arguments are formatted only when written,
and the text is the same as autobahn's own formatting."""

from __future__ import annotations

import pprint

from autobahn.util import hltype


def test_debug_arguments_are_formatted_only_when_a_line_is_written():
    from autobahn.websocket import protocol

    from chatsite.autobahn_logs import _lazy, install

    install()
    install()  # twice: still one layer
    config = [("openHandshakeTimeout", 5, "Factory")]
    assert f"{protocol.pformat(config)}" == pprint.pformat(config)
    assert protocol.hltype.lazy_of is hltype
    assert str(protocol.hltype(test_debug_arguments_are_formatted_only_when_a_line_is_written)) == hltype(
        test_debug_arguments_are_formatted_only_when_a_line_is_written
    )
    calls = []

    def formatter(value):
        calls.append(value)
        return "formatted"

    deferred = _lazy(formatter)(7)
    assert calls == []  # not written: not formatted
    assert f"{deferred}" == "formatted" and calls == [7]

    timings = protocol.Timings()
    timings.track("onOpen")
    assert isinstance(str(timings), str) and "onOpen" in str(timings)
