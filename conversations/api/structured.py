"""``response_format`` and vLLM's guided decoding fields -> the engine's ``GrammarSpec``.

Accepted: ``response_format`` ``text`` / ``json_object`` / ``json_schema`` (strict or not:
either way the output is constrained to the schema); vLLM's ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar`` (EBNF/GBNF) and its newer
``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``). At most one
of them per request. A bad schema, regex or grammar, or one that does not compile within
``API_GRAMMAR_COMPILE_TIMEOUT`` seconds, is a 400 before anything is queued.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from django.conf import settings

from conversations.api.errors import ApiError, invalid
from conversations.api.grammar_limits import check_schema_size, check_spec

_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_STRUCTURED_OUTPUTS = {
    "json": "guided_json",
    "regex": "guided_regex",
    "choice": "guided_choice",
    "grammar": "guided_grammar",
}


def check_schema(schema: Any, param: str) -> dict[str, Any]:
    """A JSON schema object, checked against its metaschema; a 400 naming ``param`` if bad."""
    import jsonschema

    check_schema_size(schema, param)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise invalid(f"The JSON schema is not valid JSON: {exc}", param=param) from exc
    if not isinstance(schema, dict):
        raise invalid("The JSON schema must be an object.", param=param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise invalid(f"Invalid JSON schema: {exc.message}", param=param) from exc
    return schema


def _response_format_spec(response_format: dict[str, Any]) -> Any:
    from inference.structured import GrammarSpec

    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind == "json_schema":
        wrapper = response_format.get("json_schema")
        if not isinstance(wrapper, dict) or "schema" not in wrapper:
            raise invalid(
                "response_format json_schema needs a 'json_schema' object with a 'schema'.",
                param="response_format.json_schema",
            )
        return GrammarSpec.json_schema(check_schema(wrapper["schema"], "response_format.json_schema.schema"))
    raise invalid(
        f"Unsupported response_format type {kind!r}: use 'text', 'json_object' or 'json_schema'.",
        param="response_format.type",
    )


def _guided_spec(field: str, value: Any) -> Any:
    from inference.structured import GrammarSpec

    if field == "guided_json":
        return GrammarSpec.json_schema(check_schema(value, field))
    if field == "guided_regex":
        if not isinstance(value, str) or not value:
            raise invalid("guided_regex must be a non-empty string.", param=field)
        return GrammarSpec.regex(value)
    if field == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise invalid("guided_choice must be a non-empty list of non-empty strings.", param=field)
        return GrammarSpec.choice(value)
    if not isinstance(value, str) or not value.strip():
        raise invalid("guided_grammar must be a non-empty EBNF grammar.", param=field)
    return GrammarSpec.ebnf(value)


def requested_formats(body: Any) -> dict[str, Any]:
    """The output-format fields the body sets (param name -> value)."""
    found: dict[str, Any] = {}
    response_format = getattr(body, "response_format", None)
    if response_format and response_format.get("type", "text") != "text":
        found["response_format"] = response_format
    for name in _GUIDED:
        value = getattr(body, name, None)
        if value is not None:
            found[name] = value
    outputs = getattr(body, "structured_outputs", None)
    if outputs:
        unknown = set(outputs) - set(_STRUCTURED_OUTPUTS)
        if unknown:
            raise invalid(
                f"Unsupported structured_outputs field(s): {', '.join(sorted(unknown))}.",
                param="structured_outputs",
            )
        for key, value in outputs.items():
            if value is not None:
                found[f"structured_outputs.{key}"] = value
    return found


def grammar_spec(body: Any) -> Any:
    """The ``GrammarSpec`` a request body asks for, or None; a 400 for bad or several."""
    response_format = getattr(body, "response_format", None)
    if response_format is not None:
        if not isinstance(response_format.get("type", "text"), str):
            raise invalid("response_format.type must be a string.", param="response_format.type")
    found = requested_formats(body)
    if not found:
        return None
    if len(found) > 1:
        raise invalid(f"Give at most one output format; got {', '.join(found)}.", param=next(iter(found)))
    param, value = next(iter(found.items()))
    if param == "response_format":
        return _response_format_spec(value)
    field = _STRUCTURED_OUTPUTS[param.split(".", 1)[1]] if param.startswith("structured_outputs.") else param
    return _guided_spec(field, value)


async def compile_or_400(engine: Any, spec: Any, param: str, owner: str | None = None) -> None:
    """Compile ``spec`` now (cached, so the engine reuses it); a 400 if it is over a cap,
    fails or is too slow, a 429 when the compile queue or ``owner``'s share of it is full."""
    from inference.structured import GrammarBusyError, GrammarError, PoolClosedError

    check_spec(spec, param)
    timeout = settings.API_GRAMMAR_COMPILE_TIMEOUT
    try:
        await asyncio.to_thread(engine.grammars.compile, spec, timeout, owner)
    except GrammarError as exc:
        raise invalid(str(exc), param=param, code="invalid_grammar") from exc
    except GrammarBusyError as exc:
        raise ApiError(
            429,
            f"Too many grammars are compiling: {exc}.",
            type="rate_limit_error",
            param=param,
            code="rate_limit_exceeded",
            headers={"Retry-After": "2"},
        ) from exc
    except PoolClosedError as exc:
        raise ApiError(
            503, "The server is shutting down; retry shortly.", type="server_error", code="engine_unavailable"
        ) from exc
