"""Imports run one way: chatsite -> conversations -> inference -> kernels, with no
circles, and the engine never imports Django (it runs and is benchmarked alone)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["chatsite", "conversations", "inference", "kernels"]


def imported_top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", ORDER)
def test_a_package_imports_only_the_packages_below_it(package: str) -> None:
    forbidden = set(ORDER[: ORDER.index(package)])
    if package in ("inference", "kernels"):
        forbidden |= {"django", "channels", "celery", "ninja"}
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_level_names(path) & forbidden)
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}
