"""GGUF files that transformers' GGUF support cannot convert (gpt-oss: see
``inference.runner.gguf.gpt_oss``), read with our own index and de-quantizers into the
(config, tokenizer, HF-named fp32 tensors) that the weights cache stores."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from inference.runner.gguf import gpt_oss
from inference.runner.gguf.weights import build_index, read_gguf_weights

if TYPE_CHECKING:
    from gguf import GGUFReader


def open_gguf(gguf_path: Path) -> GGUFReader:
    """One parse of the file's metadata, shared by the readers of one conversion: gguf-py reads
    a vocabulary's strings one by one, seconds per parse for a 49,152-token tokenizer."""
    from gguf import GGUFReader

    return GGUFReader(str(gguf_path))


def gguf_architecture(gguf_path: Path, reader: GGUFReader | None = None) -> str:
    reader = reader if reader is not None else open_gguf(gguf_path)
    return str(reader.fields["general.architecture"].contents())


def read_gpt_oss_gguf(
    gguf_path: Path, reader: GGUFReader | None = None
) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    reader = reader if reader is not None else open_gguf(gguf_path)
    fields = {key: field.contents() for key, field in reader.fields.items()}
    config = gpt_oss.gpt_oss_config(fields)
    # AutoTokenizer would read the config through transformers' GGUF reader first.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with torch.device("meta"):
        names = list(AutoModelForCausalLM.from_config(config).state_dict())
    index = build_index(gguf_path, gpt_oss.index_names(names))
    tensors = read_gguf_weights(gguf_path, index, config, blocks=False)
    return (
        config,
        tokenizer,
        gpt_oss.to_hf_layout({k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}),
    )
