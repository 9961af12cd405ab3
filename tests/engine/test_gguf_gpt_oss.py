"""gpt-oss GGUF files as llama.cpp's converter writes them (``ffn_{gate,up,down}_exps`` in
MXFP4, ggml type 39, gate and up split from HF's interleaved ``gate_up_proj``, sinks as
``attn_sinks.weight``, YaRN and the sliding window as llama.cpp's keys) load into the
original checkpoint's config and exactly its MXFP4 expert values, and decode
transformers' greedy tokens on the original checkpoint (experts de-quantized by the
test's own spec decoder)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, dequantize
from safetensors.torch import load_file

from inference.models.registry import read_model_config
from inference.runner.model_loader import load_model
from tests.support.gguf_greedy import assert_gguf_greedy_matches
from tests.support.gguf_sliding import write_gpt_oss_gguf
from tests.support.mxfp4_spec import dequantize_mxfp4
from tests.support.sliding_models import load_reference, make_sliding_model_dir, sliding_config


def test_gguf_writer_repacks_mxfp4_as_ggml_lays_it_out(tmp_path: Path) -> None:
    """The test's GGUF holds the checkpoint's expert values in ggml's layout, as gguf-py
    (an implementation of ggml's ``block_mxfp4`` apart from ours) reads them back."""
    model_dir = make_sliding_model_dir(tmp_path / "gpt_oss", "gpt_oss", seed=5)
    gguf = write_gpt_oss_gguf(model_dir, tmp_path / "gpt_oss.gguf", GGMLQuantizationType.F32)
    tensors = {t.name: t for t in GGUFReader(str(gguf)).tensors}
    source = load_file(model_dir / "model.safetensors")
    prefix = "model.layers.1.mlp.experts."
    gate_up = dequantize_mxfp4(source[prefix + "gate_up_proj_blocks"], source[prefix + "gate_up_proj_scales"])
    down = dequantize_mxfp4(source[prefix + "down_proj_blocks"], source[prefix + "down_proj_scales"])
    for name, expected in (("gate", gate_up[:, ::2]), ("up", gate_up[:, 1::2]), ("down", down)):
        tensor = tensors[f"blk.1.ffn_{name}_exps.weight"]
        assert tensor.tensor_type == GGMLQuantizationType.MXFP4
        values = dequantize(np.asarray(tensor.data), GGMLQuantizationType.MXFP4).reshape(expected.shape)
        assert np.array_equal(values, expected.numpy())


def test_gguf_gpt_oss_loads_the_original_and_decodes_transformers_tokens(tmp_path: Path) -> None:
    model_dir = make_sliding_model_dir(tmp_path / "gpt_oss", "gpt_oss", seed=5)
    gguf = write_gpt_oss_gguf(model_dir, tmp_path / "gpt_oss.gguf", GGMLQuantizationType.F32)
    loaded = load_model(gguf, device="cpu", weights_cache_dir=tmp_path / "cache")
    model, _, config = loaded
    original = read_model_config(sliding_config("gpt_oss"))
    for field in ("layer_types", "sliding_window", "gpt_oss", "rope_theta", "rope_scaling", "head_dim"):
        assert getattr(config, field) == getattr(original, field), field

    hf = load_reference(model_dir, "gpt_oss")
    ours = model.state_dict()
    for name, value in hf.state_dict().items():  # experts exactly the MXFP4 values, gate/up interleaved
        assert torch.equal(ours[name], value), name

    assert_gguf_greedy_matches(gguf, loaded, hf, 11)
