"""The GPU design's logic, on CPU: device placement and the staging-slot bookkeeping."""

from __future__ import annotations

import pytest

from inference.pd.devices import SlotRing, plan_devices


def test_workers_take_the_other_devices() -> None:
    assert plan_devices(2, 4) == [1, 2]
    assert plan_devices(3, 3, engine_device=1) == [0, 2, 0]
    assert plan_devices(2, 1) == [0, 0]  # one device: shared with the engine
    assert plan_devices(0, 0) == []
    with pytest.raises(ValueError):
        plan_devices(1, 0)
    with pytest.raises(ValueError):
        plan_devices(1, 2, engine_device=2)


def test_slots_are_taken_and_given_back() -> None:
    ring = SlotRing(num_slots=3, max_blocks=8)
    assert ring.slots_for(0) == 0 and ring.slots_for(8) == 1 and ring.slots_for(9) == 2
    first = ring.take("a", 10)
    assert first == [0, 1] and ring.free == 1
    assert ring.take("b", 9) is None  # backpressure: the engine has not copied "a" yet
    second = ring.take("c", 3)
    assert second == [2] and ring.free == 0
    ring.give_back(first)
    assert ring.take("b", 9) == [0, 1]
    with pytest.raises(ValueError):
        ring.give_back([0, 0])  # twice
    assert ring.drop_request("c") == [2] and ring.free == 1
    with pytest.raises(ValueError, match="never fit"):
        ring.take("huge", 25)
