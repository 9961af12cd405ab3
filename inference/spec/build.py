"""Builds the engine's speculator from its config: none, n-gram or draft-model proposals,
verified by ``Speculator`` or, for a hybrid model, ``HybridSpeculator``."""

from __future__ import annotations

import logging
from typing import Any

from inference.config import EngineConfig
from inference.spec.adaptive import AdaptivePolicy
from inference.spec.hybrid import speculator_class
from inference.spec.speculator import NgramBatchProposer, NoSpeculation, Proposer

logger = logging.getLogger(__name__)


def build_speculator(config: EngineConfig, engine: Any) -> NoSpeculation:
    """The speculator ``config.speculative`` asks for, over ``engine``'s block manager,
    sampler and limits (``engine``: an ``LLMEngine`` being built)."""
    if config.speculative is None:
        return NoSpeculation()
    if not engine.block_manager.supports_speculation:
        logger.info("speculative decoding is off: this block manager cannot verify proposals")
        return NoSpeculation()
    k = config.num_speculative_tokens
    proposer: Proposer
    if config.speculative == "ngram":
        proposer = NgramBatchProposer(k, config.ngram_min, config.ngram_max)
    else:
        from inference.spec.draft import DraftProposer  # noqa: PLC0415 - loads a second model

        proposer = DraftProposer.load(config, engine)
    return speculator_class(engine.block_manager)(
        proposer,
        engine.block_manager,
        engine.sampler,
        eos_token_ids=engine.eos_token_ids,
        max_model_len=engine.max_model_len,
        max_num_batched_tokens=config.max_num_batched_tokens,
        policy=AdaptivePolicy(config.speculative_min_acceptance, config.speculative_max_batch, k),
    )
