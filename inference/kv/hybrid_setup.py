"""Builds a hybrid model's state pool and block manager; a plain model gets neither."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from inference.config import EngineConfig, KVPoolSize
from inference.kv.block_manager import BlockManager
from inference.kv.hybrid_blocks import HybridBlockManager
from inference.kv.hybrid_tiers import TieredHybridBlockManager
from inference.kv.state_pool import StatePool, num_state_slots
from inference.kv.state_tiers import StateTiers, build_state_tiers
from inference.kv.tiers import TierStack
from inference.models.contract import CausalLM

# Saved states may take up to this share of the KV pool's budget on top of it.
SAVED_STATES_SHARE = 0.25


def is_hybrid(model: CausalLM) -> bool:
    """Whether ``model``'s class names recurrent layers (``CausalLMClass.recurrent_spec_for``)."""
    return type(model).recurrent_spec_for(model.config) is not None


def running_slots(config: EngineConfig) -> int:
    """Slots the running sequences may hold at once: one each, and with speculative
    decoding one more per sequence a step may verify (its state from before the step)."""
    verifying = min(config.speculative_max_batch, config.max_num_seqs) if config.speculative else 0
    return config.max_num_seqs + verifying


def build_state_pool(
    config: EngineConfig, model: CausalLM, pool: KVPoolSize, device: torch.device
) -> StatePool | None:
    """The recurrent-state pool of a hybrid model (its class names a ``RecurrentSpec``):
    a slot per sequence that can run, and the saved states' slots."""
    spec = type(model).recurrent_spec_for(model.config)
    if spec is None:
        return None
    budget = int(pool.num_blocks * pool.block_bytes * SAVED_STATES_SHARE)
    total, _ = num_state_slots(spec, running_slots(config), config.saved_states_max, budget)
    return StatePool(spec, total, device)


def build_hybrid_tiers(
    config: EngineConfig,
    states: StatePool | None,
    tiers: TierStack | None,
    fingerprint: dict | None,
    is_retained: Callable[[int], bool],
) -> StateTiers | None:
    """The saved states' host and disk tiers, beside the KV blocks' (``tiers``), which close
    them; None for a plain model or when the KV blocks have no tiers."""
    if states is None or tiers is None:
        return None
    state_tiers = build_state_tiers(
        states,
        fingerprint=fingerprint,
        host_bytes=int(config.kv_cpu_gb * 2**30 * SAVED_STATES_SHARE),
        kv_disk_dir=config.kv_disk_dir if tiers.disk is not None else None,
        disk_bytes=int(config.kv_disk_gb * 2**30 * SAVED_STATES_SHARE),
        is_retained=is_retained,
    )
    if state_tiers is not None:
        tiers.closers.append(state_tiers.close)
    return state_tiers


def make_block_manager(
    config: EngineConfig,
    states: StatePool | None,
    *args: Any,
    state_tiers: StateTiers | None = None,
    **kwargs: Any,
) -> BlockManager:
    """``BlockManager(*args, **kwargs)``, or a hybrid model's manager over ``states`` (and
    ``state_tiers`` below them, when there are any)."""
    if states is None:
        return BlockManager(*args, **kwargs)
    saved_max = states.num_slots - running_slots(config)
    hybrid: dict[str, Any] = {
        "states": states,
        "saved_states_max": saved_max,
        "saved_states_per_seq": config.saved_states_per_seq,
    }
    if state_tiers is not None:
        return TieredHybridBlockManager(*args, state_tiers=state_tiers, **hybrid, **kwargs)
    return HybridBlockManager(*args, **hybrid, **kwargs)
