"""Small modules with one job each: no source file past 500 lines and no function past
80 lines, so each piece can be read whole. Tests and kernels are exempt from the function
limit (a test reads top to bottom; a kernel is one loop nest), not from the file limit."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
SOURCE_SUFFIXES = {".py", ".js", ".c", ".h", ".css", ".html"}
# Files allowed past the limit, each with its reason and the line count it may not pass.
LONG_FILES: dict[str, int] = {}


def tracked_sources() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [
        ROOT / name
        for name in listed
        if Path(name).suffix in SOURCE_SUFFIXES
        and not name.startswith(("tests/", "static/vendor/"))
        and "/migrations/" not in name
        and (ROOT / name).is_file()
    ]


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_the_source_listing_sees_the_packages() -> None:
    tops = {path.relative_to(ROOT).parts[0] for path in tracked_sources()}
    assert {"chatsite", "conversations", "inference", "kernels", "static"} <= tops


def test_no_source_file_is_longer_than_500_lines() -> None:
    lengths = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in tracked_sources()
    }
    assert {name: n for name, n in lengths.items() if n > LONG_FILES.get(name, MAX_FILE_LINES)} == {}


def test_no_function_outside_tests_and_kernels_is_longer_than_80_lines() -> None:
    offenders = {
        str(path.relative_to(ROOT)): long_functions(path)
        for path in tracked_sources()
        if path.suffix == ".py" and path.relative_to(ROOT).parts[0] != "kernels"
    }
    assert {name: found for name, found in offenders.items() if found} == {}
