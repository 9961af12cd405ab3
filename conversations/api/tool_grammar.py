"""The grammar of the calls a request allows: xgrammar structural tags built from the
model's tool format (``inference.tools``: ``list_open``, ``call_begin``, ``call_end``,
``separator``, ``list_close``, ``trigger``).

A list of calls is ``list_open + call (+ separator + call){0,max_calls-1} + list_close``; each
call names one of the allowed functions and its arguments match that function's schema.
After the list the grammar is complete, so the answer ends there (the model's end token is
the only thing left): a list closes cleanly and never runs on to ``max_tokens``.

- ``auto``: free text until the format's trigger, then one list (a lazy grammar);
- ``required`` / a named function: the list from the first token.
"""

from __future__ import annotations

from typing import Any


def _call(fmt: Any, function: dict[str, Any], begin: str | None = None) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": fmt.call_begin(function["name"]) if begin is None else begin,
        "content": {
            "type": "json_schema",
            "json_schema": function.get("parameters") or {"type": "object"},
            # A sampled model could pad with whitespace until max_tokens.
            "max_whitespace_cnt": 1,
        },
        "end": fmt.call_end,
    }


def _one_of(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def _more_calls(fmt: Any, functions: list[dict[str, Any]], max_calls: int) -> list[dict[str, Any]]:
    """The calls after the first, up to ``max_calls`` in all."""
    if max_calls <= 1:
        return []
    further = {
        "type": "sequence",
        "elements": [_const(fmt.separator), _one_of([_call(fmt, f) for f in functions])],
    }
    if not fmt.separator:
        further = _one_of([_call(fmt, f) for f in functions])
    return [{"type": "repeat", "min": 0, "max": max_calls - 1, "content": further}]


def _const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


def _sequence(elements: list[dict[str, Any]]) -> dict[str, Any]:
    elements = [e for e in elements if e.get("type") != "const_string" or e["value"]]
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def tool_call_grammar(fmt: Any, functions: list[dict[str, Any]], choice: str, max_calls: int) -> Any:
    """The ``GrammarSpec`` of at most ``max_calls`` calls to ``functions`` (their OpenAI
    function dicts) under tool choice ``choice`` ("auto", "required" or "named")."""
    from inference.structured import GrammarSpec

    max_calls = max(1, max_calls)
    more = _more_calls(fmt, functions, max_calls)
    if choice != "auto":
        first = _one_of([_call(fmt, f) for f in functions])
        body = _sequence([_const(fmt.list_open), first, *more, _const(fmt.list_close)])
        return GrammarSpec.structural_tag({"type": "structural_tag", "format": body})
    # auto: each function's list begins with the trigger; what follows the first call is the
    # content of that call's tag, so the tag is the whole list.
    tags = []
    for function in functions:
        begin = fmt.list_open + fmt.call_begin(function["name"])
        rest = _sequence([{**_call(fmt, function), "begin": ""}, *more, _const(fmt.list_close)])
        tags.append({"type": "tag", "begin": begin, "content": rest, "end": ""})
    body = {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": tags, "stop_after_first": True}
    return GrammarSpec.structural_tag({"type": "structural_tag", "format": body})
