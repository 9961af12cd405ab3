"""An embedding model directory (``EMBEDDING_MODEL``) served beside the chat model.

A Hugging Face encoder (a sentence-transformers style directory: BERT, MiniLM, E5, ...)
loaded with transformers' ``AutoModel``; sentences are mean-pooled over their attention
mask and L2-normalised, as sentence-transformers' mean pooling does. Calls are
serialised by a lock: one forward at a time, whatever thread asks.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch


class HFEncoder:
    def __init__(self, path: str | Path, device: str = "cpu", max_batch: int = 32) -> None:
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415 - only when configured

        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"EMBEDDING_MODEL {self.path} is not a directory")
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModel.from_pretrained(self.path, dtype=torch.float32).to(device).eval()
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.model_name = self.path.name
        limit = getattr(self.model.config, "max_position_embeddings", None) or 512
        self.max_length = int(min(limit, self.tokenizer.model_max_length or limit))
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    @torch.inference_mode()
    def embed(self, inputs: list[list[int]]) -> torch.Tensor:
        """``[N, hidden]`` fp32 normalised rows for token id lists (special tokens included)."""
        for ids in inputs:
            if not ids:
                raise ValueError("every input needs at least one token")
            if len(ids) > self.max_length:
                raise ValueError(
                    f"an input has {len(ids)} tokens; this model takes at most {self.max_length}"
                )
        rows: list[torch.Tensor] = []
        with self._lock:
            for first in range(0, len(inputs), self.max_batch):
                rows.append(self._batch(inputs[first : first + self.max_batch]))
        return torch.cat(rows)

    def _batch(self, inputs: list[list[int]]) -> torch.Tensor:
        width = max(len(ids) for ids in inputs)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.tensor([x + [pad] * (width - len(x)) for x in inputs], device=self.device)
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in inputs], device=self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        return torch.nn.functional.normalize(pooled, p=2, dim=-1).cpu()
