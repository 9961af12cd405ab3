"""``ENGINE_SPECULATIVE``: the speculative-decoding setting as one string.

Forms: ``""``/``off`` (none), ``ngram``, ``ngram:k=5`` (options after a colon, comma
separated: ``k``, ``min``, ``max``, ``max_batch``), ``draft:/path/to/model`` and
``draft:/path,k=4``. Read by the settings at start; it imports nothing of the engine, so a Celery worker
that loads the settings stays free of model code.
"""

from __future__ import annotations

from typing import Any

_OPTION_FIELDS = {
    "k": "num_speculative_tokens",
    "min": "ngram_min",
    "max": "ngram_max",
    "max_batch": "speculative_max_batch",
}


def parse_speculative(raw: str) -> dict[str, Any]:
    """``EngineConfig`` keyword arguments for ``raw``; ValueError names what is wrong."""
    value = raw.strip()
    if value.lower() in ("", "off", "none", "false", "0"):
        return {"speculative": None}
    if value == "ngram" or value.startswith("ngram:"):
        kwargs: dict[str, Any] = {"speculative": "ngram"}
        options = value[len("ngram:") :].split(",") if value != "ngram" else []
    elif value.startswith("draft:"):
        path, *options = value[len("draft:") :].split(",")
        if not path.strip():
            raise ValueError("draft: needs a model path, e.g. draft:/models/SmolLM2-135M")
        kwargs = {"speculative": f"draft:{path.strip()}"}
    else:
        raise ValueError(f"expected ngram, ngram:k=N, draft:<path> or off, got {raw!r}")
    for option in options:
        key, sep, number = option.strip().partition("=")
        if not sep or key not in _OPTION_FIELDS or not number.strip().isdigit():
            raise ValueError(f"bad option {option!r}: expected k=N, min=N, max=N or max_batch=N")
        kwargs[_OPTION_FIELDS[key]] = int(number)
    return kwargs
