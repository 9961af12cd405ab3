"""What a KV block's contents depend on, for the disk tier: a block is served only to a
process whose fingerprint is the same (``DiskTier`` keeps its digest in every file).

- **weights**: what the model serves (``inference.runner.weights_identity``: the model
  files' digest, quantized or not, dtype), not the tensors left after packing;
- **tokenizer**: vocabulary, merges, added and special tokens, chat template. The K/V of a
  token id depend on the weights alone, but stored ids mean other text under another
  tokenizer, and a fine-tune that adds tokens must not meet its base model's blocks;
- **kv**: the layout (``KVSpec``), block size and dtype.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import xxhash

from inference.kv.spec import KVSpec
from inference.tokenizer import Tokenizer


def kv_fingerprint(
    weights: dict[str, Any], tokenizer: Tokenizer, spec: KVSpec, block_size: int, dtype: torch.dtype
) -> dict[str, Any]:
    kv: dict[str, Any] = {
        "num_layers": spec.num_layers,
        "planes": spec.planes,
        "token_shape": list(spec.token_shape),
        "block_size": block_size,
        "dtype": str(dtype),
    }
    if spec.windows is not None:  # a page then holds one KV group's layers (named only here,
        kv["windows"] = list(spec.windows)  # so models without windows keep their fingerprint)
    return {"weights": weights, "tokenizer": tokenizer_digest(tokenizer), "kv": kv}


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """xxh3-128 of the tokenizer's whole definition (a fast tokenizer's JSON: vocabulary,
    merges, added tokens, normalizer) with its special tokens and chat template."""
    hf = tokenizer.hf
    backend = getattr(hf, "backend_tokenizer", None)
    definition = backend.to_str() if backend is not None else json.dumps(hf.get_vocab(), sort_keys=True)
    extra = {
        "special": getattr(hf, "special_tokens_map", {}),
        "chat_template": getattr(hf, "chat_template", None),
        "eos": tokenizer.eos_token_ids,
        "bos": tokenizer.bos_token_id,
        "size": tokenizer.vocab_size,
    }
    digest = xxhash.xxh3_128(definition.encode())
    digest.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return digest.hexdigest()
