"""Tiny random sliding-window models built from transformers' own config classes and
saved as HF directories (safetensors), for the sliding-family tests and the KV benchmark.

- ``mistral``: every layer slides (window 32).
- ``gemma3``: 3 sliding layers (window 32) per full layer, two rotary bases, q/k norm,
  a final-logit soft-cap.
- ``gemma2``: alternating layers, attention and final soft-caps.
- ``gpt_oss``: alternating sliding (window 32) and full layers, sinks, YaRN, 8 experts;
  its experts saved in the MXFP4 layout (``*_blocks``/``*_scales``), the HF reference
  holding the same de-quantized values.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from inference.runner.model_loader import _COMPLETE_MARKER
from tests.support.fakes import _atomic_write_dir, smollm2_tokenizer_dir
from tests.support.mxfp4_spec import quantize_mxfp4

WINDOW = 32
_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 49152,  # SmolLM2's tokenizer
    "max_position_embeddings": 1024,
    "initializer_range": 0.2,  # clear winners: greedy runs are not decided by rounding
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "sliding_window": WINDOW,
    "tie_word_embeddings": False,
}
FAMILIES = ("mistral", "gemma3", "gemma2", "gpt_oss")


def sliding_config(family: str, num_layers: int = 4, **overrides: Any) -> Any:
    """The transformers config of a tiny ``family`` model (``architectures`` set)."""
    from transformers import Gemma2Config, Gemma3TextConfig, GptOssConfig, MistralConfig

    kw = {**_COMMON, "num_hidden_layers": num_layers}
    if family == "mistral":
        config, arch = MistralConfig(**{**kw, **overrides}), "MistralForCausalLM"
    elif family in ("gemma3", "gemma2"):
        kw["layer_types"] = [
            "full_attention" if i % 4 == 3 else "sliding_attention" for i in range(num_layers)
        ]
        kw["query_pre_attn_scalar"] = 16
        if family == "gemma3":
            kw["rope_parameters"] = {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            }
            kw["final_logit_softcapping"] = 30.0
            config, arch = Gemma3TextConfig(**{**kw, **overrides}), "Gemma3ForCausalLM"
        else:
            kw["layer_types"] = [
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)
            ]
            config, arch = Gemma2Config(**{**kw, **overrides}), "Gemma2ForCausalLM"
    elif family == "gpt_oss":
        kw["num_local_experts"], kw["num_experts_per_tok"] = 8, 2
        kw["rope_parameters"] = {
            "rope_type": "yarn",
            "factor": 8.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 128,
            "rope_theta": 150000.0,
        }
        config, arch = GptOssConfig(**{**kw, **overrides}), "GptOssForCausalLM"
    else:
        raise ValueError(f"family {family!r}: expected one of {FAMILIES}")
    config.architectures = [arch]
    return config


def make_sliding_model_dir(
    path: str | os.PathLike[str], family: str, seed: int = 0, **overrides: Any
) -> Path:
    """A random-weight HF model directory for ``family`` at ``path`` (reused when finished)."""
    from transformers import AutoModelForCausalLM

    target = Path(path)
    if (target / _COMPLETE_MARKER).is_file():
        return target
    config = sliding_config(family, **overrides)

    def write(tmp: Path) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    # HF starts norms at their identity and sinks/biases at 0: random values
                    # make every one of them count in the comparison.
                    if "norm" in name and family.startswith("gemma"):
                        p.normal_(0, 0.3)
                    elif name.endswith("sinks") or (family == "gpt_oss" and name.endswith("bias")):
                        p.normal_(0, 0.5)
        tied = config.tie_word_embeddings  # the head is the embedding: saved once
        state = {
            k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")
        }
        if family == "gpt_oss":
            state = _experts_as_mxfp4(state)
            # What gpt-oss's own checkpoints declare (the reader accepts only this method).
            config.quantization_config = {"quant_method": "mxfp4"}
        config.save_pretrained(tmp)
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        for file in smollm2_tokenizer_dir().iterdir():
            if file.name.startswith(("tokenizer", "special_tokens")):
                shutil.copy(file, tmp / file.name)
        (tmp / _COMPLETE_MARKER).write_text(f'{{"family": "{family}", "seed": {seed}}}')

    _atomic_write_dir(target, write)
    return target


def _experts_as_mxfp4(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-oss checkpoints' layout: each expert weight ``[E, in, out]`` stored as
    ``<name>_blocks`` ``[E, out, in / 32, 16]`` and ``<name>_scales`` ``[E, out, in / 32]``."""
    out = {}
    for key, value in state.items():
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = quantize_mxfp4(value.transpose(-1, -2))
            out[key + "_blocks"], out[key + "_scales"] = blocks, scales
        else:
            out[key] = value
    return out


def load_reference(path: Path, family: str, **overrides: Any) -> Any:
    """transformers' model of ``path`` (fp32, eval, fixed-length greedy); for gpt-oss the
    experts are the MXFP4 values, de-quantized by the test's own spec decoder."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tests.support.mxfp4_spec import dequantize_mxfp4

    config = sliding_config(family, **overrides)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    state: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(file))
    for key in [k for k in state if k.endswith("_blocks")]:
        name = key.removesuffix("_blocks")
        state[name] = dequantize_mxfp4(state.pop(key), state.pop(name + "_scales")).transpose(-1, -2)
    hf.load_state_dict(state, strict=True)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf
