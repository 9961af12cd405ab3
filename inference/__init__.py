"""Our LLM inference engine: paged KV cache, prefix caching, continuous batching.

Never imports Django. ``from inference import LLM, SamplingParams`` for offline use,
``AsyncEngine`` for a server.
"""

from inference.async_engine import AsyncEngine, EngineShutDownError
from inference.config import EngineConfig
from inference.engine import LLMEngine
from inference.errors import EngineOverloadedError, PromptTooLongError, UnsupportedModelError
from inference.llm import LLM
from inference.outputs import CompletionOutput, EngineStats, RequestOutput, StreamDelta
from inference.sampling_params import SamplingParams

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
