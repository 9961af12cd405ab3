"""Checks shared by the importers: typed fields and the parent links of a message tree.

Everything here is iterative: a hostile file may describe a chain of any depth, and a
recursive walk would overflow the stack.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping
from datetime import UTC, datetime
from typing import Any


class InvalidFile(ValueError):
    """The file cannot be imported; the message says why in one line."""


def need(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    # bool is an int in Python, never a number in a file
    if isinstance(value, bool) and kind is not bool:
        raise InvalidFile(f"{where}: expected {_name(kind)}, got true/false")
    if not isinstance(value, kind):
        raise InvalidFile(f"{where}: expected {_name(kind)}, got {type(value).__name__}")
    return value


def optional(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    return None if value is None else need(value, kind, where)


def number(value: Any, where: str, default: float | None = None) -> float | None:
    if value is None:
        return default
    return float(need(value, (int, float), where))


def timestamp(value: Any, where: str) -> datetime | None:
    """An ISO 8601 string (our files) or seconds since the epoch (ChatGPT's)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            raise InvalidFile(f"{where}: {value!r} is not a time") from None
    try:
        parsed = datetime.fromisoformat(need(value, str, where))
    except ValueError:
        raise InvalidFile(f"{where}: {value!r} is not an ISO 8601 time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _name(kind: type | tuple[type, ...]) -> str:
    names = {
        str: "text",
        int: "an integer",
        float: "a number",
        dict: "an object",
        list: "a list",
        bool: "true/false",
    }
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def parents_first(parents: Mapping[Hashable, Hashable | None], where: str) -> list[Hashable]:
    """The node keys ordered so that each comes after its parent.

    Raises :class:`InvalidFile` for a parent that is not in ``parents`` and for parent links
    that form a cycle (nodes no root reaches)."""
    children: dict[Hashable, list[Hashable]] = defaultdict(list)
    roots = []
    for key, parent in parents.items():
        if parent is None:
            roots.append(key)
        elif parent not in parents:
            raise InvalidFile(f"{where}: message {key!r} names a missing parent {parent!r}")
        else:
            children[parent].append(key)
    order = list(roots)
    at = 0
    while at < len(order):
        order.extend(children.get(order[at], ()))
        at += 1
    if len(order) != len(parents):
        reached = set(order)
        stuck = next(key for key in parents if key not in reached)
        raise InvalidFile(f"{where}: the parent links form a cycle (through message {stuck!r})")
    return order
