"""The batched LoRA shrink and expand on the best path for the tensors: the C kernel for
fp32 on the CPU, the Triton kernel on CUDA, the PyTorch reference otherwise."""

from __future__ import annotations

import torch

from chatsite_kernels.cpu import lora as cpu_lora
from chatsite_kernels.reference import lora_expand_ref, lora_shrink_ref


def _on_cpu_kernel(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and cpu_lora.available()


def shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[T, K]`` rows times their adapters' A ``[S, R, K]`` -> ``[T, R]`` fp32."""
    if _on_cpu_kernel(x, a):
        return cpu_lora.lora_shrink(x, a, slots)
    if x.is_cuda:
        from chatsite_kernels.triton import lora as triton_lora  # noqa: PLC0415 - CUDA only

        return triton_lora.lora_shrink(x, a, slots)
    return lora_shrink_ref(x, a, slots)


def expand(
    y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor, out: torch.Tensor
) -> None:
    """``out[t] += scales[s] * b[s] @ y[t]`` in place (``out`` may be a column slice)."""
    if _on_cpu_kernel(y, b, out):
        cpu_lora.lora_expand(y, b, slots, scales, out)
    elif y.is_cuda:
        from chatsite_kernels.triton import lora as triton_lora  # noqa: PLC0415 - CUDA only

        triton_lora.lora_expand(y, b, slots, scales, out)
    else:
        lora_expand_ref(y, b, slots, scales, out)
