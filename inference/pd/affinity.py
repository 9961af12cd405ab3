"""Which CPU cores the engine process and each prefill worker run on.

Decode steps are short and memory-bound, prefill is long and compute-bound; on one
machine they compete for the same cores, so the engine and the workers each get their
own (``os.sched_setaffinity``; torch's thread count follows the set).

``EngineConfig.pd_affinity`` (``ENGINE_PD_AFFINITY``):

- ``"auto"`` (default): the cores this process may use, in order, split into
  ``workers + 1`` equal shares, the engine's first, a remainder going to the workers.
  With fewer cores than processes they are shared round robin.
- ``"off"``: no pinning (the OS schedules everything everywhere).
- explicit sets, ``;`` between processes, engine first: ``"0-3;4-7;8-11"`` (ranges and
  commas as in ``taskset -c``).
"""

from __future__ import annotations

import os

CpuSet = frozenset[int]


def parse_cpus(text: str) -> CpuSet:
    """``"0-3,6"`` -> {0, 1, 2, 3, 6}."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"no CPUs in {text!r}")
    return frozenset(cpus)


def plan_affinity(
    setting: str, num_workers: int, available: CpuSet | None = None
) -> tuple[CpuSet | None, list[CpuSet | None]]:
    """(engine's cores, each worker's cores); None = leave unpinned."""
    setting = setting.strip().lower()
    if setting == "off" or num_workers == 0:
        return None, [None] * num_workers
    if setting != "auto":
        groups = [parse_cpus(g) for g in setting.split(";")]
        if len(groups) != num_workers + 1:
            raise ValueError(
                f"pd_affinity {setting!r} names {len(groups)} CPU sets; "
                f"it needs {num_workers + 1} (the engine's, then one per worker)"
            )
        return groups[0], groups[1:]
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    shares = num_workers + 1
    if len(cores) < shares:
        sets = [frozenset({cores[i % len(cores)]}) for i in range(shares)]
        return sets[0], sets[1:]
    size = len(cores) // shares
    engine = frozenset(cores[:size])
    rest = cores[size:]
    per_worker, extra = divmod(len(rest), num_workers)
    workers, start = [], 0
    for i in range(num_workers):
        end = start + per_worker + (1 if i < extra else 0)
        workers.append(frozenset(rest[start:end]))
        start = end
    return engine, workers


def pin(cpus: CpuSet | None) -> int | None:
    """Pin this process to ``cpus``; returns the thread count to use (None: unchanged)."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        return None
    os.sched_setaffinity(0, cpus)
    return len(cpus)
