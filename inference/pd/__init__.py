"""Prefill/decode disaggregation: prefill worker processes beside the serving engine.

``EngineConfig.prefill_workers = N`` (``ENGINE_PREFILL_WORKERS``) starts N worker
processes on the same model (``worker``); the engine's scheduler
(``DisaggregatedScheduler``) sends them the long prompts and decodes. Blocks come back
through shared memory (``transfer``) with their chained hashes, the worker pool
restarts dead workers and falls back to local prefill (``workers``), and the cores are
split between the processes (``affinity``). See docs/prefill-decode.md.
"""

from __future__ import annotations

import logging

import torch

from inference.config import EngineConfig
from inference.pd.affinity import pin, plan_affinity
from inference.pd.messages import WorkerSpec
from inference.pd.workers import WorkerPool

logger = logging.getLogger(__name__)


def start_prefill_workers(config: EngineConfig) -> WorkerPool:
    """Pin this process to its cores and start the workers on theirs (before the serving
    engine allocates its pool, so each process is placed first); the engine then builds
    its ``DisaggregatedScheduler`` with them."""
    if not config.enable_prefix_caching:
        raise ValueError("prefill workers need prefix caching: their blocks arrive as prefix-cache hits")
    engine_cpus, worker_cpus = plan_affinity(config.pd_affinity, config.prefill_workers)
    threads = pin(engine_cpus)
    if threads and not config.num_threads:
        torch.set_num_threads(threads)
    specs = [WorkerSpec(config, cpus) for cpus in worker_cpus]
    logger.info(
        "prefill workers: %d (engine cores %s, workers' %s)",
        len(specs),
        sorted(engine_cpus) if engine_cpus else "all",
        [sorted(c) if c else "all" for c in worker_cpus],
    )
    return WorkerPool(specs, config.pd_queue_size, config.pd_timeout_s)
