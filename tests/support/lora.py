"""Random PEFT LoRA adapters for a test's base model, built by ``peft`` itself, and the
HF + peft reference greedy decode on them."""

from __future__ import annotations

from pathlib import Path

import torch

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_peft_adapter(
    base_dir: str | Path,
    out_dir: str | Path,
    rank: int,
    seed: int,
    targets: list[str] | None = None,
    alpha: int | None = None,
    scale_b: float = 1.0,
) -> Path:
    """A rank-``rank`` LoRA adapter of random A and B (peft's ``init_lora_weights=False``:
    B is not zero, so the adapter changes the model) on every projection in ``targets``,
    saved as peft saves one. ``scale_b`` multiplies B, to make the adapter's effect larger."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        config = LoraConfig(
            r=rank,
            lora_alpha=alpha if alpha is not None else 2 * rank,
            target_modules=targets or ALL_PROJECTIONS,
            lora_dropout=0.0,
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config)
        if scale_b != 1.0:
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if "lora_B" in name:
                        param.mul_(scale_b)
        model.save_pretrained(out_dir)
    return Path(out_dir)


def peft_model(base_dir: str | Path, adapter_dir: str | Path | None) -> torch.nn.Module:
    """HF's model on ``base_dir`` with the adapter applied by peft (None: the base alone)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # fixed-length greedy runs
    model.generation_config.pad_token_id = 0
    if adapter_dir is None:
        return model
    return PeftModel.from_pretrained(model, adapter_dir).eval()
