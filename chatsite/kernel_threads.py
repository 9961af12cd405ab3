"""How the model kernels' OpenMP threads wait between parallel regions, set before torch loads.

libgomp reads ``OMP_WAIT_POLICY`` once, when torch loads it. Its default spins a thread
that ran out of work for a while before it sleeps. In a server process the kernels'
threads share the cores with the event loop, the engine thread and the database threads
(and on a shared machine with other processes): a decode step runs some 240 parallel
regions, each ending in a barrier, and a thread spinning at one holds a core that the
thread it waits for needs. ``passive`` makes idle threads sleep at once; ``active``
keeps them spinning, for a machine whose cores the kernels have to themselves.

``ENGINE_OMP_WAIT_POLICY`` picks the policy (``passive`` unless set; empty: libgomp's
own default); an ``OMP_WAIT_POLICY`` already in the environment wins over both.
"""

from __future__ import annotations

import os

DEFAULT_POLICY = "passive"


def set_kernel_thread_waits(environ: dict[str, str] | None = None) -> str | None:
    """Put the chosen policy into ``OMP_WAIT_POLICY`` unless one is there; the policy in
    force afterwards (None: libgomp's default)."""
    env = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" not in env:
        policy = env.get("ENGINE_OMP_WAIT_POLICY", DEFAULT_POLICY).strip()
        if policy:
            env["OMP_WAIT_POLICY"] = policy
    return env.get("OMP_WAIT_POLICY")
