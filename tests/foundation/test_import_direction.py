"""Imports run one way: chatsite -> conversations -> inference -> kernels (imported as
``chatsite_kernels``), with no circles,
the engine never imports Django (it runs and is benchmarked alone), and nothing that runs in
production imports the tooling (benchmarks, GPU checks, test stand-ins).

The graph is read from the AST, so imports inside functions and under ``TYPE_CHECKING``
count as much as those at the top of a module: a circle hidden in a function is still a circle.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["chatsite", "conversations", "inference", "chatsite_kernels"]
TOOLING = ["benchmarks", "tools", "tests"]
# The folder of each import name that is not its own (see setup.py).
FOLDERS = {"chatsite_kernels": "kernels"}
IMPORT_NAMES = {folder: name for name, folder in FOLDERS.items()}
WEB_FRAMEWORKS = {"django", "channels", "celery", "ninja", "daphne"}


def module_name(path: Path) -> str:
    top, *rest = path.relative_to(ROOT).with_suffix("").parts
    return ".".join([IMPORT_NAMES.get(top, top), *rest]).removesuffix(".__init__")


@cache
def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for top in LAYERS + TOOLING
        for path in (ROOT / FOLDERS.get(top, top)).rglob("*.py")
        if "migrations" not in path.parts
    }


def owning_module(dotted: str) -> str | None:
    """The project module a dotted import name lands in (``a.b.C`` -> ``a.b``)."""
    modules = project_modules()
    while dotted and dotted not in modules:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def imported_names(path: Path) -> set[str]:
    """Every absolute name ``path`` imports, wherever the import statement stands.

    ``from a.b import c`` yields ``a.b.c``: the submodule ``c`` where there is one, else a
    name that resolves back to the module ``a.b``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; the project imports absolutely"
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@cache
def import_graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in project_modules().items():
        if name.split(".")[0] not in LAYERS:
            continue
        targets = {owning_module(imported) for imported in imported_names(path)}
        graph[name] = {target for target in targets if target and target != name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative so a deep import chain cannot hit the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


def test_the_graph_sees_imports_inside_functions_and_type_checking_blocks(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from inference.engine import llm_engine\n"
        "def f():\n    import chatsite_kernels.reference\n    from conversations.chat import tree\n",
        encoding="utf-8",
    )
    names = imported_names(source)
    assert {"inference.engine.llm_engine", "chatsite_kernels.reference", "conversations.chat.tree"} <= names
    assert owning_module("inference.errors.PromptTooLongError") == "inference.errors"
    assert owning_module("chatsite_kernels.cpu.build.cache_dir") == "chatsite_kernels.cpu.build"


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [sorted(c) for c in strongly_connected(graph) if len(c) > 1] == [["a", "b", "c"]]


def test_there_are_no_import_circles() -> None:
    cycles = [sorted(c) for c in strongly_connected(import_graph()) if len(c) > 1]
    assert cycles == []


@pytest.mark.parametrize("package", LAYERS)
def test_a_package_imports_only_the_packages_below_it(package: str) -> None:
    above = set(LAYERS[: LAYERS.index(package)])
    offenders = {
        module: sorted(target for target in targets if target.split(".")[0] in above)
        for module, targets in import_graph().items()
        if module.split(".")[0] == package
    }
    assert {module: names for module, names in offenders.items() if names} == {}


@pytest.mark.parametrize("package", ["inference", "kernels"])
def test_the_engine_never_imports_a_web_framework(package: str) -> None:
    offenders = {
        module_name(path): sorted({n.split(".")[0] for n in imported_names(path)} & WEB_FRAMEWORKS)
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_runtime_modules_never_import_tooling() -> None:
    offenders = {
        module: sorted(target for target in targets if target.split(".")[0] in TOOLING)
        for module, targets in import_graph().items()
    }
    assert {module: names for module, names in offenders.items() if names} == {}


# ``type X = ...`` is a statement of its own from Python 3.12.
BINDINGS = (ast.Assign, ast.AnnAssign, *([ast.TypeAlias] if hasattr(ast, "TypeAlias") else []))


def any_aliases(source: str) -> list[str]:
    """Module-level names bound to ``Any`` (``Manager = Any``, ``X: TypeAlias = Any``,
    ``type X = Any``): each stands in for a type, erasing it, so that an import (and the
    circle it would show) need not be written."""
    found = []
    body = list(ast.parse(source).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If | ast.Try):  # ``if TYPE_CHECKING: ... else: X = Any``
            body.extend([*node.body, *node.orelse, *getattr(node, "finalbody", [])])
            continue
        value = getattr(node, "value", None)
        if isinstance(node, BINDINGS) and value is not None:
            if ast.unparse(value) in ("Any", "typing.Any", "t.Any"):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_alias_finder_finds_an_alias_of_any() -> None:
    source = (
        "from typing import Any, TYPE_CHECKING, TypeAlias\n"
        "Manager = Any\n"
        "Record: TypeAlias = Any\n"
        "if not TYPE_CHECKING:\n    Engine = Any\n"
        "fields: dict[str, Any] = {}\n"
        "def f(x: Any) -> None:\n    local = Any\n"
    )
    assert sorted(int(hit.split(":")[0]) for hit in any_aliases(source)) == [2, 3, 5]


def test_no_module_stands_any_in_for_a_project_type() -> None:
    offenders = {
        name: hits
        for name, path in project_modules().items()
        if name.split(".")[0] in LAYERS and (hits := any_aliases(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}
