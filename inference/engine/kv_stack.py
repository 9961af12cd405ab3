"""The KV pool and everything that hands out its blocks, built together.

The config sizes the pool (``EngineConfig.size_kv_pool``); the model runner allocates it;
the block manager and scheduler hand out its blocks; the tiers below it (host memory,
disk) need the pool tensor itself, so they are built last and joined to the block manager.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from inference.config import EngineConfig, KVPoolSize
from inference.engine.scheduler import Scheduler
from inference.engine.step_budget import StepBudget
from inference.kv.block_manager import BlockManager
from inference.kv.fingerprint import kv_fingerprint
from inference.kv.tiers import TierStack, build_tiers
from inference.model_config import ModelConfig
from inference.runner.cuda_graphs import MAX_GRAPH_BATCH
from inference.runner.model_runner import ModelRunner
from inference.runner.weights_identity import weights_identity
from inference.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class KVStack:
    pool: KVPoolSize
    block_manager: BlockManager
    scheduler: Scheduler
    runner: ModelRunner
    tiers: TierStack | None


def build_kv_stack(
    config: EngineConfig, model: torch.nn.Module, model_config: ModelConfig, tokenizer: Tokenizer
) -> KVStack:
    """Size the pool for ``model`` (on its device, in its dtype, laid out by its
    ``kv_spec``) and build the parts that use it."""
    param = next(model.parameters())
    device, dtype, bs = param.device, param.dtype, config.block_size
    block_bytes = model.kv_spec.block_bytes(bs, dtype)
    pool = config.size_kv_pool(model_config, block_bytes, device, graph_batch_limit=MAX_GRAPH_BATCH)
    block_manager = BlockManager(pool.num_blocks, bs, config.enable_prefix_caching)
    if config.prefill_workers:
        from inference.pd import build_disaggregated_scheduler  # noqa: PLC0415 - only with workers

        scheduler: Scheduler = build_disaggregated_scheduler(config, block_manager, pool.max_model_len)
    else:
        scheduler = Scheduler(
            block_manager, config.max_num_batched_tokens, config.max_num_seqs, pool.max_model_len
        )
    if config.step_budget_ms > 0:
        scheduler.step_budget = StepBudget(config.step_budget_ms / 1000, config.max_num_batched_tokens)
    runner = ModelRunner(
        model,
        model_config,
        pool.num_blocks,
        bs,
        device,
        dtype,
        max_num_seqs=config.max_decode_batch,
        max_model_len=pool.max_model_len,
        enforce_eager=config.enforce_eager,
    )
    scheduler.attach_pool(runner.kv_cache)
    fingerprint = None
    if config.kv_disk_dir:  # hashing the tokenizer (and, once, the weights) only when it counts
        fingerprint = kv_fingerprint(weights_identity(model), tokenizer, model.kv_spec, bs, dtype)
    tiers = build_tiers(
        runner.kv_cache,
        bs,
        fingerprint=fingerprint,
        kv_cpu_gb=config.kv_cpu_gb,
        kv_disk_dir=config.kv_disk_dir,
        kv_disk_gb=config.kv_disk_gb,
        is_retained=block_manager.is_retained,
    )
    block_manager.tiers = tiers
    logger.info(
        "engine: %s on %s/%s, %d KV blocks of %d tokens (%.2f GiB), max_model_len %d",
        model_config.name,
        device,
        dtype,
        pool.num_blocks,
        bs,
        pool.gib,
        pool.max_model_len,
    )
    return KVStack(pool, block_manager, scheduler, runner, tiers)
