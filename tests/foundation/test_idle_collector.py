"""A served process's full garbage collections wait for its engine to be idle (or, under
constant load, for the longest interval); CPython's own full collections are off meanwhile."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

from conversations.ops.idle_collector import FULL_COLLECTIONS_OFF, IdleCollector

ROOT = Path(__file__).resolve().parents[2]


class Engine:
    def __init__(self) -> None:
        self.steps, self.busy = 0, False

    def activity(self) -> tuple[int, bool]:
        return self.steps, self.busy


def collector(
    engine: Engine, clock: list[float], max_interval_s: float = 300.0
) -> tuple[IdleCollector, list]:
    collected: list[float] = []
    made = IdleCollector(
        engine.activity,
        max_interval_s=max_interval_s,
        clock=lambda: clock[0],
        collect=lambda: collected.append(clock[0]),
    )
    return made, collected


def test_no_full_collection_while_the_engine_works():
    engine, clock = Engine(), [0.0]
    made, collected = collector(engine, clock)
    engine.busy = True
    for _ in range(100):
        engine.steps += 10
        clock[0] += 0.5
        made.tick()
    assert collected == []


def test_one_full_collection_once_the_engine_has_been_idle_a_whole_tick_after_work():
    engine, clock = Engine(), [0.0]
    made, collected = collector(engine, clock)
    engine.busy, engine.steps = True, 40
    made.tick()
    engine.busy, engine.steps = False, 45  # finished since the last tick
    clock[0] = 0.5
    assert not made.tick()  # maybe a pause between two arrivals: wait a tick
    clock[0] = 1.0
    assert made.tick()
    for _ in range(10):  # idle since: nothing new to collect
        clock[0] += 0.5
        assert not made.tick()
    assert collected == [1.0]


def test_requests_arriving_one_by_one_are_not_interrupted():
    engine, clock = Engine(), [0.0]
    made, collected = collector(engine, clock)
    for _ in range(20):  # a request runs between every two ticks, none is running at a tick
        engine.steps += 5
        clock[0] += 0.5
        made.tick()
    assert collected == []


def test_work_between_two_ticks_counts_even_if_no_tick_saw_it_busy():
    engine, clock = Engine(), [0.0]
    made, collected = collector(engine, clock)
    engine.steps = 3  # a short request came and went
    clock[0] = 0.5
    made.tick()
    clock[0] = 1.0
    assert made.tick()
    assert collected == [1.0]


def test_constant_load_still_collects_at_the_longest_interval():
    engine, clock = Engine(), [0.0]
    made, collected = collector(engine, clock, max_interval_s=60.0)
    engine.busy = True
    while clock[0] < 200:
        clock[0] += 0.5
        engine.steps += 1
        made.tick()
    assert collected == [60.0, 120.0, 180.0]


def test_start_turns_cpythons_full_collections_off_and_stop_gives_them_back():
    before = gc.get_threshold()
    made = IdleCollector(lambda: (0, False), max_interval_s=300.0, poll_s=0.01)
    made.start()
    try:
        assert gc.get_threshold() == (before[0], before[1], FULL_COLLECTIONS_OFF)
    finally:
        made.stop()
    assert gc.get_threshold() == before


def test_a_server_process_starts_the_collector_and_a_plain_import_does_not():
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.pop("GC_FULL_MAX_INTERVAL_S", None)
    probe = "import gc, chatsite.asgi; print(gc.get_threshold()[2])"
    served = "import daphne.cli; " + probe  # the daphne command loads its CLI first
    runs = {}
    for name, code in (("plain", probe), ("served", served)):
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        runs[name] = int(result.stdout.split()[-1])
    assert runs == {"plain": gc.get_threshold()[2], "served": FULL_COLLECTIONS_OFF}
