"""Our LLM inference engine: paged KV cache, prefix caching, continuous batching.

Never imports Django. ``from inference import LLM, SamplingParams`` for offline use,
``AsyncEngine`` for a server.

The public names load on first access (PEP 562), so a web module can import
``inference`` or its plain types (``SamplingParams``, the errors, the outputs) at the
top without paying for torch and the model code until an engine is built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.config import EngineConfig
    from inference.engine.async_engine import AsyncEngine, EngineShutDownError
    from inference.engine.llm import LLM
    from inference.engine.llm_engine import LLMEngine
    from inference.engine.outputs import CompletionOutput, EngineStats, RequestOutput, StreamDelta
    from inference.errors import (
        EngineOverloadedError,
        InvalidPromptError,
        PromptTooLongError,
        UnsupportedModelError,
    )
    from inference.sampling.params import SamplingParams

# Public name -> the module that defines it.
_EXPORTS = {
    "LLM": "inference.engine.llm",
    "AsyncEngine": "inference.engine.async_engine",
    "CompletionOutput": "inference.engine.outputs",
    "EngineConfig": "inference.config",
    "EngineOverloadedError": "inference.errors",
    "EngineShutDownError": "inference.engine.async_engine",
    "EngineStats": "inference.engine.outputs",
    "InvalidPromptError": "inference.errors",
    "LLMEngine": "inference.engine.llm_engine",
    "PromptTooLongError": "inference.errors",
    "RequestOutput": "inference.engine.outputs",
    "SamplingParams": "inference.sampling.params",
    "StreamDelta": "inference.engine.outputs",
    "UnsupportedModelError": "inference.errors",
}

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineOverloadedError",
    "EngineShutDownError",
    "EngineStats",
    "InvalidPromptError",
    "LLMEngine",
    "PromptTooLongError",
    "RequestOutput",
    "SamplingParams",
    "StreamDelta",
    "UnsupportedModelError",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inference' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
