"""How the model kernels' OpenMP threads wait between parallel regions, set before torch loads.

libgomp reads ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` once, when torch loads it. A decode
step runs some 240 parallel regions, each ending in a barrier, so how an idle thread waits
for the next region sets much of a small step's time:

- ``spin`` (the default): spin ``SPIN_COUNT`` rounds (about a tenth of a millisecond) and
  then sleep. Measured on this 2-core machine, SmolLM2 decoding 4 chats of 1,500 tokens:
  20.5 ms a step quiet (``passive`` 33.3 ms: each region wakes a sleeping thread through
  the kernel; ``active`` 19.5 ms), and 49.8 ms beside one busy process (``passive`` 34.5,
  ``active`` 58.2), where a spinning thread holds a core the thread it waits for needs.
- ``passive``: sleep at once; for cores shared with much other work.
- ``active``: spin without end; for cores the kernels have to themselves.

``ENGINE_OMP_WAIT_POLICY`` picks one (empty: libgomp's own default); an ``OMP_WAIT_POLICY``
or ``GOMP_SPINCOUNT`` already in the environment wins.
"""

from __future__ import annotations

import os

DEFAULT_POLICY = "spin"
SPIN_COUNT = 3000


def set_kernel_thread_waits(environ: dict[str, str] | None = None) -> str | None:
    """Put the chosen policy into the environment unless one is there; the policy in force
    afterwards: ``OMP_WAIT_POLICY``'s value, ``"spin N"`` for a bounded spin, or None
    (libgomp's default)."""
    env = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        policy = env.get("ENGINE_OMP_WAIT_POLICY", DEFAULT_POLICY).strip()
        if policy == "spin":
            env["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        elif policy:
            env["OMP_WAIT_POLICY"] = policy
    if "OMP_WAIT_POLICY" in env:
        return env["OMP_WAIT_POLICY"]
    return f"spin {env['GOMP_SPINCOUNT']}" if "GOMP_SPINCOUNT" in env else None
