"""Compile the kernels for a real GPU target (sm_90) without a GPU.

The interpreter runs kernels as NumPy and skips the compiler, so errors such as a
non-constexpr global read inside a kernel pass every interpreted test and only
fail on a GPU. ``tools.gpu_check.compile_check`` compiles each launcher's variants to a
cubin with the ptxas in the triton wheel; run here in a subprocess because this
process has ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _has_nvidia_backend() -> bool:
    try:  # find_spec of a submodule imports its parent package
        return importlib.util.find_spec("triton.backends.nvidia") is not None
    except ImportError:
        return False


@pytest.mark.skipif(not _has_nvidia_backend(), reason="triton (with its NVIDIA backend) is not installed")
def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check.compile_check", "--quick", "--arch", "90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failed" in result.stdout
