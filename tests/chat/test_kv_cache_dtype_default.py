"""The site's engine takes its KV pool's element type from ENGINE_KV_CACHE_DTYPE, "auto" by
default: float16 on the CPU (half the bytes each decode step's attention reads)."""

from __future__ import annotations

import pytest
import torch
from django.conf import settings


@pytest.mark.usefixtures("tiny_engine")
def test_the_default_pool_on_the_cpu_is_float16() -> None:
    from conversations.ops.engine_handle import get_engine

    assert settings.ENGINE["kv_cache_dtype"] == "auto", "is ENGINE_KV_CACHE_DTYPE set in this environment?"
    engine = get_engine().engine
    assert engine.device.type == "cpu"
    assert engine.runner.kv_cache.dtype == torch.float16
    assert engine.dtype == torch.float32  # the model itself keeps its dtype
