"""Block hashes never match across models or LoRA adapters: each engine's chain starts from
its model's root, and an adapter's key is mixed into it (inference.kv.chain_hash)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager
from inference.kv.chain_hash import hash_root, prefix_hashes

BS = 4
tokens = st.lists(st.integers(0, 50_000), min_size=BS, max_size=6 * BS)
names = st.text(min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(tokens, names, names, st.integers(0, 2**64 - 1), st.integers(0, 3))
def test_no_block_hash_is_shared_by_two_models(ids, a, b, salt, salt_block):
    if a == b:
        return
    ra, rb = hash_root("model", a), hash_root("model", b)
    ha = prefix_hashes(ids, BS, salt, salt_block, ra)
    hb = prefix_hashes(ids, BS, salt, salt_block, rb)
    assert ha and not set(ha) & set(hb)


@settings(max_examples=200, deadline=None)
@given(tokens, names, st.integers(1, 2**64 - 1), st.integers(1, 2**64 - 1))
def test_no_block_is_shared_by_two_adapters_or_an_adapter_and_its_base(ids, model, key_a, key_b):
    """Sequences of one engine with the same tokens and different adapters (key 0: the base)
    name none of their blocks alike, and a cached block of one serves no other."""
    manager = BlockManager(64, BS, hash_root=hash_root("model", model))
    keys = {0, key_a, key_b}
    seqs = []
    for key in keys:
        seq = Sequence(list(ids), len(ids))
        seq.adapter_key = key
        seqs.append(seq)
    hashes = [set(manager._hashes(s, len(ids) // BS)) for s in seqs]
    assert sum(len(h) for h in hashes) == len(set().union(*hashes))
    # The first computes and caches its blocks; the others match none of them, and a
    # sequence of the first's adapter matches all of them.
    first, *others = seqs
    assert manager.allocate_slots(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    manager.register_full_blocks(first)
    assert first.num_registered_blocks == len(ids) // BS
    for other in others:
        assert manager.match_prefix(other) == []
    again = Sequence(list(ids), len(ids))
    again.adapter_key = first.adapter_key
    assert len(manager.match_prefix(again)) == (len(ids) - 1) // BS


def test_an_adapter_reloaded_with_other_weights_gets_a_new_key():
    from inference.lora.adapter import adapter_key

    assert adapter_key("math", "digest-1") != adapter_key("math", "digest-2")
    assert adapter_key("math", "digest-1") == adapter_key("math", "digest-1")
