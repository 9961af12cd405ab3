"""Paged-attention kernels (Triton) beside their plain PyTorch references.

`kernels.reference` is the CPU path of the engine and the oracle the Triton
kernels are tested against. Nothing here imports the engine or Django.
"""
