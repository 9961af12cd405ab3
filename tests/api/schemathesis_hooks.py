"""Schemathesis hooks (SCHEMATHESIS_HOOKS=tests.api.schemathesis_hooks): keep generated
requests cheap. Valid but huge ``max_tokens`` / ``n`` are clamped, and a missing
``max_tokens`` gets a small one, so the run tests the API, not the model's speed on
two cores; invalid values (wrong types, out of range) are left alone. String ``model``
values become the served model's id (SCHEMATHESIS_SERVED_MODEL), so bodies reach the engine
instead of stopping at a 404. Both happen in ``before_call``, which sees every case of every
phase (the examples' and the coverage phase's boundary values too, which ``map_body`` does
not: a coverage case with the largest valid ``max_tokens`` once ran past the read timeout)."""

from __future__ import annotations

import os

import schemathesis

MAX_TOKENS = 4
MAX_N = 2


def _small_int(value: object, cap: int) -> object:
    if isinstance(value, int) and not isinstance(value, bool) and value > cap:
        return cap
    return value


def cheap_body(body: dict) -> dict:
    body = dict(body)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    for name in ("max_tokens", "max_completion_tokens"):
        if name in body:
            body[name] = _small_int(body[name], MAX_TOKENS)
    if "n" in body:
        body["n"] = _small_int(body["n"], MAX_N)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > MAX_N and all(isinstance(p, str | list) for p in prompt):
        body["prompt"] = prompt[:MAX_N]
    return body


@schemathesis.hook
def before_call(context, case, **kwargs):
    if not isinstance(case.body, dict):
        return
    body = cheap_body(case.body)
    served = os.environ.get("SCHEMATHESIS_SERVED_MODEL")
    if served and isinstance(body.get("model"), str):
        body["model"] = served
    case.body = body
