"""The KV pool and everything that hands out its blocks, built together.

The config sizes the pool (``EngineConfig.size_kv_pool``); the model runner allocates it;
the tiers below it (host memory, disk) need the pool tensor itself, the block manager
needs the tiers, and the scheduler the block manager, so they are built in that order,
each whole: nothing is attached after construction. The retention registry, which the
tiers and the block manager both ask, comes first.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from inference.config import EngineConfig, KVPoolSize
from inference.engine.scheduler import Scheduler
from inference.engine.step_budget import StepBudget
from inference.kv.block_manager import BlockManager
from inference.kv.chain_hash import hash_root
from inference.kv.fingerprint import kv_fingerprint
from inference.kv.hybrid_setup import build_hybrid_tiers, build_state_pool, make_block_manager
from inference.kv.kv_dtype import resolve_kv_dtype
from inference.kv.retention import Retention
from inference.kv.tiers import TierStack, build_tiers
from inference.layers.cpu_matmul import resolve_cpu_matmul
from inference.model_config import ModelConfig
from inference.models.contract import CausalLM
from inference.runner.cuda_graphs import MAX_GRAPH_BATCH
from inference.runner.model_runner import ModelRunner
from inference.runner.weights_identity import ATTRIBUTE as WEIGHTS_ATTRIBUTE
from inference.runner.weights_identity import weights_identity
from inference.tokenizer import Tokenizer

if TYPE_CHECKING:
    from inference.pd.workers import WorkerPool

logger = logging.getLogger(__name__)


@dataclass
class KVStack:
    pool: KVPoolSize
    block_manager: BlockManager
    scheduler: Scheduler
    runner: ModelRunner
    tiers: TierStack | None


def build_kv_stack(
    config: EngineConfig, model: CausalLM, model_config: ModelConfig, tokenizer: Tokenizer
) -> KVStack:
    """Size the pool for ``model`` (on its device, in ``config.kv_cache_dtype``, laid out by
    its ``kv_spec``) and build the parts that use it, each given its collaborators whole."""
    param = next(model.parameters())
    device, bs = param.device, config.block_size
    dtype = resolve_kv_dtype(config.kv_cache_dtype, device, param.dtype)
    block_bytes = model.kv_spec.block_bytes(bs, dtype)
    pool = config.size_kv_pool(model_config, block_bytes, device, graph_batch_limit=MAX_GRAPH_BATCH)
    workers = None
    if config.prefill_workers:  # pinned and started before this process allocates its pool
        from inference.pd import start_prefill_workers  # noqa: PLC0415 - only with workers

        workers = start_prefill_workers(config)
    states = build_state_pool(config, model, pool, device)
    runner = ModelRunner(
        model,
        model_config,
        pool.num_blocks,
        bs,
        device,
        param.dtype,
        max_num_seqs=config.max_decode_batch,
        max_model_len=pool.max_model_len,
        enforce_eager=config.enforce_eager,
        recurrent_states=states.states if states is not None else None,
        cpu_matmul=resolve_cpu_matmul(config.cpu_matmul, device),
        kv_dtype=dtype,
    )
    fingerprint = None
    if config.kv_disk_dir:  # hashing the tokenizer (and, once, the weights) only when it counts
        fingerprint = kv_fingerprint(weights_identity(model), tokenizer, model.kv_spec, bs, dtype)
    # The tiers evict retained blocks last, as the block manager does: one registry for both.
    retention = Retention()
    tiers = build_tiers(
        runner.kv_cache,
        bs,
        fingerprint=fingerprint,
        kv_cpu_gb=config.kv_cpu_gb,
        kv_disk_dir=config.kv_disk_dir,
        kv_disk_gb=config.kv_disk_gb,
        is_retained=retention.is_retained,
    )
    block_manager = make_block_manager(
        config,
        states,
        pool.num_blocks,
        bs,
        config.enable_prefix_caching,
        tiers=tiers,
        retention=retention,
        groups=model.kv_spec.groups,
        hash_root=model_hash_root(config, model, model_config),
        state_tiers=build_hybrid_tiers(config, states, tiers, fingerprint, retention.is_retained),
    )
    scheduler = _build_scheduler(config, block_manager, pool.max_model_len, runner.kv_cache, workers)
    logger.info(
        "engine: %s on %s/%s, %d KV blocks of %d tokens in %s (%.2f GiB), max_model_len %d",
        model_config.name,
        device,
        param.dtype,
        pool.num_blocks,
        bs,
        dtype,
        pool.gib,
        pool.max_model_len,
    )
    return KVStack(pool, block_manager, scheduler, runner, tiers)


def model_hash_root(config: EngineConfig, model: torch.nn.Module, model_config: ModelConfig) -> int:
    """The root of this engine's block hashes: its served name, the model's own name and
    what its weights were loaded from (``load_model``'s tag, when there is one; hashing an
    untagged model's tensors is left to the disk tier, which needs it)."""
    if not config.served_name:
        # One model in the process (the ENGINE_MODEL shorthand): its chains start at 0, where
        # the disk tier's blocks from before several models existed start. A named model's
        # root is the same in every process, so its restart finds its own disk blocks.
        return 0
    identity = getattr(model, WEIGHTS_ATTRIBUTE, None)
    tagged = json.dumps(identity, sort_keys=True, default=str) if identity else ""
    return hash_root(config.served_name or "", model_config.name, tagged)


def _build_scheduler(
    config: EngineConfig,
    block_manager: BlockManager,
    max_model_len: int,
    kv_cache: torch.Tensor,
    workers: WorkerPool | None,
) -> Scheduler:
    """The plain scheduler, or with prefill workers the one that sends them long prompts."""
    step_budget = None
    if config.step_budget_ms > 0:
        step_budget = StepBudget(config.step_budget_ms / 1000, config.max_num_batched_tokens)
    limits = (config.max_num_batched_tokens, config.max_num_seqs, max_model_len)
    if workers is None:
        return Scheduler(block_manager, *limits, step_budget=step_budget)
    from inference.pd.scheduler import DisaggregatedScheduler  # noqa: PLC0415 - only with workers

    return DisaggregatedScheduler(
        block_manager,
        *limits,
        kv_cache=kv_cache,
        workers=workers,
        min_prompt_tokens=config.pd_min_prompt_tokens,
        step_budget=step_budget,
    )
