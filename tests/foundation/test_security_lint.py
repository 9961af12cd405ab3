"""``make test`` runs bandit over the product's packages before pytest, and it finds no
high-severity issue (a real one is fixed; a false one carries ``# nosec`` and its reason)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from tests.foundation.test_import_direction import FOLDERS

ROOT = Path(__file__).resolve().parents[2]


def make_test_recipe() -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("test:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_make_test_runs_bandit_at_high_severity_over_every_product_package_before_pytest():
    recipe = make_test_recipe()
    bandit = next(i for i, line in enumerate(recipe) if "bin/bandit " in line)
    assert bandit < next(i for i, line in enumerate(recipe) if "-m pytest" in line)
    args = shlex.split(recipe[bandit])
    assert "--severity-level" in args and args[args.index("--severity-level") + 1] == "high"
    installed = {top for top, dists in packages_distributions().items() if "chatsite" in dists}
    assert {FOLDERS.get(top, top) for top in installed} == {
        "chatsite",
        "conversations",
        "inference",
        "kernels",
    }
    assert {FOLDERS.get(top, top) for top in installed} <= set(args)


def test_bandit_finds_no_high_severity_issue_in_the_product():
    args = shlex.split(next(line for line in make_test_recipe() if "bin/bandit " in line))
    bandit = Path(sys.executable).with_name("bandit")
    result = subprocess.run([str(bandit), *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
