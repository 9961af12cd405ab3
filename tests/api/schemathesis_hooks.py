"""Schemathesis hooks (SCHEMATHESIS_HOOKS=tests.api.schemathesis_hooks): keep generated
requests cheap. Valid but huge ``max_tokens`` / ``n`` are clamped, and a missing
``max_tokens`` gets a small one, so the run tests the API, not the model's speed on
two cores; invalid values (wrong types, out of range) are left alone. String ``model``
values become the served model's id (SCHEMATHESIS_SERVED_MODEL) in ``before_call``, which
sees every case (the examples phase's explicit examples too, which ``map_body`` does not),
so bodies reach the engine instead of stopping at a 404."""

from __future__ import annotations

import os

import schemathesis

MAX_TOKENS = 4
MAX_N = 2


def _small_int(value: object, cap: int) -> object:
    if isinstance(value, int) and not isinstance(value, bool) and value > cap:
        return cap
    return value


@schemathesis.hook
def map_body(context, body):
    if not isinstance(body, dict):
        return body
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
    served = os.environ.get("SCHEMATHESIS_SERVED_MODEL")
    if served and isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body = {**case.body, "model": served}
