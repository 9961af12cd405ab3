"""Starting and stopping the server processes tests run beside them (the live site, the
OIDC provider): wait until one answers, stop it politely and then not."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx


def wait_until_answering(
    process: subprocess.Popen,
    answering: Callable[[], bool],
    *,
    name: str,
    log: Callable[[], str],
    seconds: float,
    interval: float,
    stop_timeout: float,
) -> None:
    """Return once ``answering()`` is true (an HTTP error counts as not yet). A ``RuntimeError``
    with the process's log when it exits first or ``seconds`` pass (then it is stopped);
    ``answering`` may raise one of its own to give up at once."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log()}")
        try:
            if answering():
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    stop_process(process, stop_timeout)
    raise RuntimeError(f"{name} did not become ready within {seconds:g} s:\n{log()}")


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL when it has not exited within ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
