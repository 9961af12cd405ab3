"""Prefix-cache salts and the namespaces they live in.

A salt is a 64-bit value mixed into the block hash chain (``block_manager.salted_parent``):
salted blocks match only requests with the same salt. Every salt has a *namespace*, its
root (a site uses one per user, ``"user:<id>"``): the namespace's own salt is
``salt_hash(namespace)``, and a caller's salt inside it is derived from that root, so two
namespaces can never produce the same salt whatever salts their callers choose. The
namespace id is kept with every cached block, which is what lets
``LLMEngine.purge_namespace`` find and drop all of one namespace's blocks in every tier.
"""

from __future__ import annotations

from dataclasses import dataclass

import xxhash


def salt_hash(salt: str) -> int:
    """A string as a 64-bit salt (never 0, which means unsalted)."""
    return xxhash.xxh64_intdigest(b"cache-salt\0" + salt.encode()) or 1


def nested_salt(root: int, salt: str) -> int:
    """``salt`` inside the namespace whose own salt is ``root``: H(root ‖ salt)."""
    return xxhash.xxh64_intdigest(b"cache-salt-nested\0" + root.to_bytes(8, "little") + salt.encode()) or 1


@dataclass(frozen=True, slots=True)
class CacheSalt:
    value: int = 0  # mixed into the hash chain; 0 = unsalted
    namespace: int = 0  # the root's id, kept with each salted block; 0 = none


def cache_salt(namespace: str | None, salt: str | None) -> CacheSalt:
    """The salt of a request in ``namespace`` asking for ``salt``: the namespace's own salt
    without one, the nested salt with one. A salt given without a namespace is a namespace
    of its own (vLLM's plain ``cache_salt``, for a single tenant); a site must always name
    the namespace, so that a caller's salt can never equal another namespace's."""
    if not namespace:
        if not salt:
            return CacheSalt()
        namespace, salt = salt, None
    root = salt_hash(namespace)
    return CacheSalt(nested_salt(root, salt) if salt else root, root)
