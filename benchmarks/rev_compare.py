"""Single-stream decode speed of two source trees, measured in turns (A, B, A, B, ...) so
that the load of a shared machine falls on both alike.

Each tree runs in its own process, started once and kept loaded: ``python -c`` of
``CHILD`` with the tree first on ``PYTHONPATH``, and ``chatsite_kernels`` (the package
``setup.py`` maps onto ``kernels/``) linked to that tree's ``kernels`` folder, so neither
process imports the other's code. A process measures one run each time it reads ``run``
and answers with one JSON line. A git revision gets a temporary detached worktree,
removed afterwards.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Only the engine's stable API (EngineConfig, LLMEngine, SamplingParams), so that older
# revisions run it too.
CHILD = """
import json, sys, time
import torch
from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.sampling.params import SamplingParams

model, tokens, prompt_len, threads = sys.argv[1] or None, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if threads:
    torch.set_num_threads(threads)
engine = LLMEngine(EngineConfig(model=model, device="cpu"))
prompt = [1000 + (7 * i) % 20000 for i in range(prompt_len)]
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    if line.strip() != "run":
        break
    engine.block_manager.reset_prefix_cache()
    request = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    engine.step()  # prefill and the first token
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    elapsed = time.perf_counter() - start
    produced = len(engine.request_output(request).token_ids)
    print(json.dumps({"tokens_per_s": (produced - 1) / elapsed}), flush=True)
"""


@dataclass
class Side:
    label: str
    tree: Path
    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


@contextmanager
def tree_of(rev: str | None) -> Iterator[Path]:
    """The working tree (``rev`` None) or a temporary detached worktree of ``rev``."""
    if rev is None:
        yield REPO
        return
    with tempfile.TemporaryDirectory(prefix="rev-compare-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


def _start(tree: Path, shim: Path, args: list[str]) -> subprocess.Popen[str]:
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "chatsite_kernels").symlink_to(tree / "kernels", target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(shim)])}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    _answer(proc)  # loaded
    return proc


def _answer(proc: subprocess.Popen[str]) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"benchmark process {proc.args[:2]} exited with {proc.wait()}")
    return json.loads(line)


def _run_once(proc: subprocess.Popen[str]) -> float:
    assert proc.stdin is not None
    proc.stdin.write("run\n")
    proc.stdin.flush()
    return float(_answer(proc)["tokens_per_s"])


def compare(
    baseline_rev: str, candidate_rev: str | None, rounds: int, args: list[str], report: bool = True
) -> tuple[Side, Side]:
    """(baseline, candidate) with ``rounds`` runs each, taken in turns."""
    with tree_of(baseline_rev) as base_tree, tree_of(candidate_rev) as cand_tree:
        sides = (
            Side(f"baseline {baseline_rev}", base_tree),
            Side(f"candidate {candidate_rev or 'working tree'}", cand_tree),
        )
        with tempfile.TemporaryDirectory(prefix="rev-compare-shim-") as shim:
            procs = [_start(s.tree, Path(shim) / str(i), args) for i, s in enumerate(sides)]
            try:
                for r in range(rounds):
                    order = (0, 1) if r % 2 == 0 else (1, 0)  # neither side always goes first
                    for i in order:
                        sides[i].runs.append(_run_once(procs[i]))
                    if report:
                        print(
                            f"round {r + 1}: "
                            + ", ".join(f"{s.label} {s.runs[-1]:.1f} tok/s" for s in sides),
                            file=sys.stderr,
                        )
            finally:
                for proc in procs:
                    if proc.stdin:
                        proc.stdin.close()
                    proc.wait(timeout=60)
    return sides
