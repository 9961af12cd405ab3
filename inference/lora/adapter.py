"""A PEFT LoRA adapter read from its directory (``adapter_config.json`` and
``adapter_model.safetensors``) into host tensors.

Supported: LoRA on any of the Llama family's projections (q/k/v/o, gate/up/down) with
``bias: none``, plain or rsLoRA scaling. Refused by name: DoRA, per-module rank or alpha
patterns, ``modules_to_save``, fan-in/fan-out weights, and targets outside the layers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import xxhash

from inference.kv.chain_hash import hash_root

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class LoraLoadError(ValueError):
    """The adapter cannot be served: names the file or field and why."""


def adapter_key(name: str, digest: str) -> int:
    """The adapter's key in the KV blocks' hash chain: its name and its weights' digest, so
    an adapter reloaded under the same name with other weights shares no block with the old."""
    return hash_root("lora", name, digest)


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    digest: str  # of the config and weight files' bytes
    # (layer, projection) -> (A [rank, in], B [out, rank]), fp32 on the host
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def key(self) -> int:
        return adapter_key(self.name, self.digest)


def _refuse(config: dict, path: Path) -> None:
    checks = {
        "use_dora": "DoRA adapters are not supported",
        "rank_pattern": "per-module ranks (rank_pattern) are not supported",
        "alpha_pattern": "per-module alphas (alpha_pattern) are not supported",
        "modules_to_save": "modules_to_save (fully trained modules) is not supported",
        "fan_in_fan_out": "fan_in_fan_out weights are not supported",
    }
    for key, why in checks.items():
        if config.get(key):
            raise LoraLoadError(f"{path}: {why}")
    if config.get("bias", "none") != "none":
        raise LoraLoadError(f"{path}: LoRA biases (bias={config['bias']!r}) are not supported")
    if config.get("peft_type", "LORA") != "LORA":
        raise LoraLoadError(f"{path}: not a LoRA adapter (peft_type={config.get('peft_type')!r})")


def load_peft_adapter(name: str, path: str | Path, num_layers: int | None = None) -> LoraAdapter:
    """Read the adapter at ``path``; ``num_layers`` (the base model's) is checked."""
    from safetensors.torch import load_file  # noqa: PLC0415 - only when adapters are used

    root = Path(path)
    config_file, weights_file = root / "adapter_config.json", root / "adapter_model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        raise LoraLoadError(
            f"{root}: expected adapter_config.json and adapter_model.safetensors (a PEFT adapter)"
        )
    raw_config = config_file.read_bytes()
    config = json.loads(raw_config)
    _refuse(config, root)
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    digest = xxhash.xxh3_128_hexdigest(raw_config + weights_file.read_bytes())
    adapter = LoraAdapter(name, str(root), rank, scaling, digest)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(weights_file)).items():
        match = _KEY.search(key)
        if match is None or match.group(2) not in PROJECTIONS:
            raise LoraLoadError(f"{weights_file}: {key} is not a LoRA weight of a supported projection")
        layer, proj, half = int(match.group(1)), match.group(2), match.group(3)
        if num_layers is not None and layer >= num_layers:
            raise LoraLoadError(f"{weights_file}: {key} names layer {layer}; the model has {num_layers}")
        halves.setdefault((layer, proj), {})[half] = tensor.float().contiguous()
    for target, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise LoraLoadError(f"{weights_file}: {target} lacks lora_A or lora_B")
        a, b = pair["A"], pair["B"]
        if a.shape[0] != rank or b.shape[1] != rank:
            raise LoraLoadError(f"{weights_file}: {target} has rank {a.shape[0]}, the config says {rank}")
        adapter.weights[target] = (a, b)
    if not adapter.weights:
        raise LoraLoadError(f"{weights_file}: holds no LoRA weights")
    return adapter
