"""Tiny random hybrid linear-attention models (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) built from
transformers' own config classes, and a runner that drives our model class directly
over a paged KV pool and a recurrent state pool, as the engine's runner does.

Four layers, three Gated DeltaNet and one full attention; two value heads per key head
and unequal key / value head sizes, so a mix-up of heads or dimensions shows. HF
initialises the norms to ones (or zeros for the (1 + w) ones) and the decays to a fixed
range: they are randomised here, so a misplaced norm or gate changes the logits.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from inference.layers.attention_context import AttentionContext
from inference.layers.recurrent_context import RecurrentContext
from inference.models.registry import build_model, read_model_config
from tests.support.fakes import PagedSequenceRunner, smollm2_tokenizer_dir

TINY_HYBRID: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 12,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "initializer_range": 0.08,
}
# family -> (config class, model class, overrides)
HYBRID_FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 40,
            "mlp_only_layers": [2],  # one dense layer among the sparse ones
        },
    ),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {}),
    "qwen3_5_moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 40,
        },
    ),
}


def hybrid_config(family: str, **changes: Any) -> Any:
    """The family's tiny transformers config, ``architectures`` set; ``changes`` replace
    entries of ``TINY_HYBRID`` (e.g. the tokenizer's ``vocab_size``)."""
    import transformers

    config_class, model_class, overrides = HYBRID_FAMILIES[family]
    config = getattr(transformers, config_class)(**{**TINY_HYBRID, **changes}, **overrides)
    config.architectures = [model_class]
    return config


# Released Qwen3.5 checkpoints are vision-language models around the text model.
VISION_LANGUAGE: dict[str, tuple[str, str]] = {
    "qwen3_5": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
    "qwen3_5_moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration"),
}
TINY_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 64}


def vision_language_config(family: str) -> Any:
    import transformers

    config_class, model_class = VISION_LANGUAGE[family]
    text = {**TINY_HYBRID, **HYBRID_FAMILIES[family][2]}
    config = getattr(transformers, config_class)(text_config=text, vision_config=TINY_VISION)
    config.architectures = [model_class]
    return config


def _randomise(hf: torch.nn.Module) -> None:
    """HF's initial norms and decays would hide a misplaced norm or gate."""
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name or name.endswith(("A_log", "dt_bias")):
                param.normal_(0.0, 0.3)


def make_vision_language_pair(family: str, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(HF's vision-language model, our text model loaded from its state dict)."""
    import transformers

    config = vision_language_config(family)
    torch.manual_seed(seed)
    hf = getattr(transformers, config.architectures[0])(config).eval()
    _randomise(hf)
    ours = build_model(read_model_config(config))
    ours.load_weights(hf.state_dict())
    return hf, ours.eval()


def make_hybrid_pair(family: str, seed: int = 0, **changes: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(HF's model, ours with the same weights), both fp32 and in eval mode."""
    import transformers

    config = hybrid_config(family, **changes)
    torch.manual_seed(seed)
    hf = getattr(transformers, config.architectures[0])(config).eval()
    _randomise(hf)
    hf.generation_config.eos_token_id = None  # fixed-length greedy runs
    hf.generation_config.pad_token_id = 0
    ours = build_model(read_model_config(config))
    ours.load_weights(hf.state_dict())
    return hf, ours.eval()


class HybridRunner(PagedSequenceRunner):
    """Feeds sequences through our hybrid model step by step: each sequence has its KV
    blocks (handed out from a shuffled list) and a recurrent state slot (from the end of
    the pool, so slot numbers differ from sequence numbers)."""

    def __init__(
        self, model: torch.nn.Module, num_blocks: int = 64, num_slots: int = 6, seed: int = 0
    ) -> None:
        super().__init__(model, num_blocks, block_size=16, shuffle=True, seed=seed)
        self.states = model.recurrent_spec.allocate(num_slots)
        for tensors in (self.states.conv, self.states.ssm):  # stale contents a fresh sequence must ignore
            for t in tensors:
                t.fill_(float("nan"))
        self.free_slots = list(range(num_slots))
        self.slots: list[int] = []

    def add_sequence(self) -> int:
        self.slots.append(self.free_slots.pop())
        return super().add_sequence()

    def _attach(self, ctx: AttentionContext, seqs: list[int]) -> None:
        ctx.recurrent = RecurrentContext(
            state_slots=torch.tensor([self.slots[i] for i in seqs], dtype=torch.int64),
            has_initial_state=torch.tensor([self.lengths[i] > 0 for i in seqs]),
            states=self.states,
        )


def save_hybrid_model_dir(hf: torch.nn.Module, path: Path) -> Path:
    """``hf`` saved as a model directory (safetensors, SmolLM2's tokenizer files), for the
    processes that load the model themselves (prefill workers)."""
    hf.save_pretrained(path)
    for file in smollm2_tokenizer_dir().iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, path / file.name)
    return path
