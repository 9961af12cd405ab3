"""The site's engine takes the CPU products' precision from ENGINE_CPU_MATMUL, "auto" by
default: bf16 copies for many-row products where the CPU has AMX-BF16 tiles, fp32 elsewhere."""

from __future__ import annotations

import pytest
from django.conf import settings

from inference.layers.cpu_matmul import has_amx_bf16


@pytest.mark.usefixtures("tiny_engine")
def test_the_default_runs_many_row_products_in_bf16_where_the_cpu_has_amx() -> None:
    from conversations.ops.engine_handle import get_engine

    assert settings.ENGINE["cpu_matmul"] == "auto", "is ENGINE_CPU_MATMUL set in this environment?"
    runner = get_engine().engine.runner
    amx = has_amx_bf16()
    assert runner.cpu_matmul.bf16 == amx
    assert (runner.bf16_weight_bytes > 0) == amx
    mlp = runner.model.model.layers[0].mlp
    assert (mlp._gate_up_bf16 is not None) == amx
