"""Typed records at the chat's seams: no function in ``conversations/chat/`` takes a
parameter typed ``Any`` (an engine, a tokenizer, an answer's record, a manager...), which
would hide what crosses the seam and let a circle of imports go unseen.

JSON payloads are the one place ``Any`` stays: inside a ``dict``, ``Mapping`` or
``Sequence`` of them (``dict[str, Any]``, ``Sequence[Mapping[str, Any]]``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "conversations" / "chat"
PAYLOADS = ("dict[", "Mapping[", "Sequence[", "list[dict")


def any_parameters(source: str) -> list[str]:
    """``function(parameter: annotation)`` for each parameter typed ``Any`` outside a payload."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = node.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        for arg in filter(None, every):
            annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            bare = annotation
            for payload in PAYLOADS:
                if payload in bare:
                    bare = bare.replace(payload, "").replace("Any", "")
            if "Any" in bare:
                found.append(f"{node.lineno}: {node.name}({arg.arg}: {annotation})")
    return found


def test_the_finder_sees_an_any_parameter_and_spares_a_payload() -> None:
    source = (
        "def f(engine: Any, fields: dict[str, Any], *rows: Sequence[Mapping[str, Any]]) -> None: ...\n"
        "async def g(self, gen: Any | None = None, **data: Any) -> None: ...\n"
    )
    assert [hit.split(" ", 1)[1] for hit in any_parameters(source)] == [
        "f(engine: Any)",
        "g(gen: Any | None)",
        "g(data: Any)",
    ]


def test_no_chat_function_takes_a_parameter_typed_any() -> None:
    offenders = {
        path.name: hits
        for path in sorted(CHAT.glob("*.py"))
        if (hits := any_parameters(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}
