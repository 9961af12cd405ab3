"""Our LLM inference engine: paged KV cache, prefix caching, continuous batching.

Never imports Django. ``from inference import LLM, SamplingParams`` for offline use,
``AsyncEngine`` for a server.
"""

from inference.config import EngineConfig
from inference.engine.async_engine import AsyncEngine, EngineShutDownError
from inference.engine.llm import LLM
from inference.engine.llm_engine import LLMEngine
from inference.engine.outputs import CompletionOutput, EngineStats, RequestOutput, StreamDelta
from inference.errors import EngineOverloadedError, PromptTooLongError, UnsupportedModelError
from inference.sampling.params import SamplingParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineOverloadedError",
    "EngineShutDownError",
    "EngineStats",
    "LLMEngine",
    "PromptTooLongError",
    "RequestOutput",
    "SamplingParams",
    "StreamDelta",
    "UnsupportedModelError",
]
