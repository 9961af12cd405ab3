"""The kernels' OpenMP wait policy is chosen before torch loads, in every server process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from chatsite.kernel_threads import DEFAULT_POLICY, SPIN_COUNT, set_kernel_thread_waits

ROOT = Path(__file__).resolve().parents[2]


def test_policy_defaults_to_a_bounded_spin_and_the_setting_or_environment_wins() -> None:
    env: dict[str, str] = {}
    assert DEFAULT_POLICY == "spin" and set_kernel_thread_waits(env) == f"spin {SPIN_COUNT}"
    assert env == {"GOMP_SPINCOUNT": str(SPIN_COUNT)}  # libgomp's policy itself left unset
    env = {"ENGINE_OMP_WAIT_POLICY": "passive"}
    assert set_kernel_thread_waits(env) == "passive" and "GOMP_SPINCOUNT" not in env
    assert set_kernel_thread_waits({"ENGINE_OMP_WAIT_POLICY": "active"}) == "active"
    assert set_kernel_thread_waits({"ENGINE_OMP_WAIT_POLICY": ""}) is None  # libgomp's own
    env = {"OMP_WAIT_POLICY": "ACTIVE", "ENGINE_OMP_WAIT_POLICY": "passive"}
    assert set_kernel_thread_waits(env) == "ACTIVE"
    assert set_kernel_thread_waits({"GOMP_SPINCOUNT": "100"}) == "spin 100"


def test_server_entry_points_set_it_before_torch_loads() -> None:
    """Importing the ASGI application sets the policy, and torch is not loaded before."""
    code = (
        "import builtins, os\n"
        "real = builtins.__import__\n"
        "def watch(name, *a, **k):\n"
        "    if name == 'torch' and 'GOMP_SPINCOUNT' not in os.environ:\n"
        "        raise SystemExit('torch loaded before the policy was set')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = watch\n"
        "import chatsite.asgi\n"
        "print(os.environ['GOMP_SPINCOUNT'])\n"
    )
    chosen = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "ENGINE_OMP_WAIT_POLICY"}
    env = {k: v for k, v in os.environ.items() if k not in chosen}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(SPIN_COUNT)
