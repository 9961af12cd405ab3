"""Moving KV blocks between processes through POSIX shared memory.

The worker copies a prompt's blocks out of its own pool into one new segment
(``[num_blocks, *pool[b].shape]``, the pool's dtype) and sends the segment's name; the
engine maps it, copies each block straight into the pool block the prefix cache gave
it, and unlinks the segment. A segment whose result is no longer wanted is unlinked
all the same (``discard``)."""

from __future__ import annotations

import math
from multiprocessing import shared_memory

import torch


def write_blocks(blocks: torch.Tensor) -> tuple[str, int]:
    """Copy ``blocks`` into a new segment; returns (its name, bytes)."""
    nbytes = blocks.numel() * blocks.element_size()
    shm = shared_memory.SharedMemory(create=True, size=max(1, nbytes))
    try:
        view = torch.frombuffer(shm.buf, dtype=blocks.dtype, count=blocks.numel()).view(blocks.shape)
        view.copy_(blocks)
        del view
    finally:
        shm.close()
    return shm.name, nbytes


class MappedBlocks:
    """A segment written by ``write_blocks``, mapped for reading; ``close`` unlinks it."""

    def __init__(self, name: str, num_blocks: int, block_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self._shm = shared_memory.SharedMemory(name=name)
        count = num_blocks * math.prod(block_shape)
        self.blocks = torch.frombuffer(self._shm.buf, dtype=dtype, count=count).view(num_blocks, *block_shape)

    def close(self) -> None:
        del self.blocks
        self._shm.close()
        self._shm.unlink()


def discard_all(*names: str | None) -> None:
    """``discard`` each segment (a result's blocks and its recurrent state)."""
    for name in names:
        discard(name)


def discard(name: str | None) -> None:
    """Unlink a segment nobody will read (its request was aborted or fell back)."""
    if name is None:
        return
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    shm.close()
    shm.unlink()
