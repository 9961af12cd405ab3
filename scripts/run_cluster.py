"""Start a local site of N server processes on consecutive ports, plus a Celery worker.

    DATABASE_URL=postgresql://... REDIS_URL=redis://... .venv/bin/python scripts/run_cluster.py 2 --port 8000

Each process runs its own engine (the model is loaded once per process) and they act as
one site through PostgreSQL and the Redis channel layer. The processes come from the
``Procfile``, run by honcho (a Foreman clone from PyPI): ``web`` N times on ports PORT,
PORT+1, ... and one ``worker``. Put a reverse proxy in front to spread tabs over them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("processes", type=int, nargs="?", default=2, help="web processes (default 2)")
    parser.add_argument("--port", type=int, default=8000, help="port of the first process (default 8000)")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    args = parser.parse_args(argv)
    missing = [name for name in ("DATABASE_URL", "REDIS_URL") if not os.environ.get(name)]
    if missing:
        print(
            f"error: {' and '.join(missing)} must be set: several processes share one PostgreSQL and one Redis",
            file=sys.stderr,
        )
        return 2
    if args.processes < 1:
        print("error: at least one process", file=sys.stderr)
        return 2
    bin_dir = Path(sys.executable).parent
    honcho = shutil.which("honcho", path=str(bin_dir)) or shutil.which("honcho")
    if honcho is None:
        print("error: honcho is not installed (pip install honcho)", file=sys.stderr)
        return 2
    env = {
        **os.environ,
        "HOST": args.host,
        "ENGINE_PRELOAD": os.environ.get("ENGINE_PRELOAD", "true"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [python, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    print(
        f"  {args.processes} processes: http://{args.host}:{args.port}/ .. :{args.port + args.processes - 1}/"
    )
    command = [honcho, "-f", str(ROOT / "Procfile"), "-d", str(ROOT), "start"]
    command += ["-p", str(args.port), "-c", f"web={args.processes},worker=1"]
    os.execvpe(honcho, command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
