"""Caps on what a request may ask a grammar compile to do, each a clear 400 before anything
compiles: the size of a JSON schema, and the counts of regex and EBNF repetitions
(``x{30000}`` compiles for tens of seconds: xgrammar unrolls a counted repetition).

The caps are settings: ``API_GRAMMAR_MAX_SCHEMA_BYTES`` and ``API_GRAMMAR_MAX_REPEAT``.
Compiles that pass them still run under a time limit in a process that is killed past it
(``inference.structured.compile_pool``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from django.conf import settings

from conversations.api.errors import invalid

# A counted repetition {n}, {n,} or {n,m}; an escaped brace is a literal.
_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def check_schema_size(schema: Any, param: str) -> None:
    """A 400 when the schema's JSON text is over the cap (before it is validated at all)."""
    limit = settings.API_GRAMMAR_MAX_SCHEMA_BYTES
    size = len(schema.encode()) if isinstance(schema, str) else len(json.dumps(schema, separators=(",", ":")))
    if size > limit:
        raise invalid(
            f"The JSON schema is {size:,} bytes; at most {limit:,} are accepted.",
            param=param,
            code="schema_too_large",
        )


def check_repetitions(text: str, param: str, what: str = "regex") -> None:
    """A 400 naming the first counted repetition above the cap in a regex or EBNF text."""
    limit = settings.API_GRAMMAR_MAX_REPEAT
    for match in _REPEAT.finditer(text):
        count = max(int(g) for g in match.groups() if g)
        if count > limit:
            raise invalid(
                f"The {what} repeats {match.group(0)}: a counted repetition may be at most {limit}.",
                param=param,
                code="repetition_too_large",
            )


def check_schema_patterns(schema: Any, param: str) -> None:
    """Every ``pattern`` and ``patternProperties`` regex of a JSON schema within the cap."""
    for pattern in _patterns(schema):
        check_repetitions(pattern, param, "pattern")


def _patterns(node: Any) -> Iterator[str]:
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                yield pattern
            props = node.get("patternProperties")
            if isinstance(props, dict):
                yield from (k for k in props if isinstance(k, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def check_spec(spec: Any, param: str) -> None:
    """The caps for a ``GrammarSpec`` about to compile."""
    if spec.kind == "json_schema":
        check_schema_size(spec.source, param)
        check_schema_patterns(json.loads(spec.source), param)
    elif spec.kind == "regex":
        check_repetitions(spec.source, param)
    elif spec.kind == "ebnf":
        check_repetitions(spec.source, param, "grammar")
