"""LoRA adapters served on a base model, many in one batch (punica / S-LoRA style).

``adapter``: a PEFT adapter directory read into host tensors, with its key. ``manager``:
the adapters of one engine, the resident ones stacked on the model's device (at most
``max_loras``, least recently used evicted back to host memory), and each step's rows.
``layers``: the adapters' products inside the attention and MLP layers, around the base
weights' one product. ``ops``: the batched shrink and expand, on the C kernel (CPU), the
Triton kernel (CUDA) or the PyTorch reference.
"""

from inference.lora.adapter import LoraAdapter, LoraLoadError, adapter_key, load_peft_adapter
from inference.lora.manager import LoraManager

__all__ = ["LoraAdapter", "LoraLoadError", "LoraManager", "adapter_key", "load_peft_adapter"]
