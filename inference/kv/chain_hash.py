"""The prefix cache's chained block hashes: xxh64(parent hash ‖ the block's token ids).

Equal hashes mean equal prefixes, so a block is found again by any sequence (or any
process: a prefill worker, a restart reading the disk tier) that starts the same way.
A cache salt is mixed into the parent of the block where it starts, which salts that
block and, through the chain, every block after it (``inference.kv.salt``).

The chain starts from a *root* instead of 0: the served model's (``hash_root``), with the
LoRA adapter's key mixed in for a request that runs one. K/V computed by one model or
adapter are wrong for every other, so no two of them may ever name a block alike, even
for the same tokens.
"""

from __future__ import annotations

from array import array

import xxhash


def chain_hash(parent: int, token_ids: list[int]) -> int:
    """Hash of a full block given its parent's hash, so equal hashes mean equal prefixes."""
    return xxhash.xxh64_intdigest(parent.to_bytes(8, "little") + array("q", token_ids).tobytes())


def hash_root(*parts: str) -> int:
    """The chain's root for a model (or an adapter: its key, xor-ed into its model's root)
    named by ``parts`` (never 0, the root of nothing)."""
    return xxhash.xxh64_intdigest(b"kv-root\0" + "\0".join(parts).encode()) or 1


def salted_parent(hashes: list[int], i: int, salt: int = 0, salt_block: int = 0, root: int = 0) -> int:
    """What block ``i``'s hash chains from: the root for the first block, salted where the
    salt starts, which salts that block and, through the chain, every block after it."""
    parent = hashes[i - 1] if i else root
    if salt and i == salt_block:
        parent ^= salt
    return parent


def prefix_hashes(
    token_ids: list[int], block_size: int, salt: int = 0, salt_block: int = 0, root: int = 0
) -> list[int]:
    """The chained hashes of the full blocks of ``token_ids`` (salted as a sequence with
    ``cache_salt == salt`` and ``cache_salt_block == salt_block`` would be, from ``root``)."""
    hashes: list[int] = []
    for i in range(len(token_ids) // block_size):
        parent = salted_parent(hashes, i, salt, salt_block, root)
        hashes.append(chain_hash(parent, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes
