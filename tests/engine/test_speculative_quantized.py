"""On the default model's quantized CPU path, a verify step's rows get exactly the logits
that decoding each position alone gives: the products' register tiles and decode
attention compute a row the same way whatever rows are beside it, for proposals longer
than one register tile too. Greedy speculation is then the target's argmax chain bit for
bit, not only up to ties."""

from __future__ import annotations

import pytest
import torch

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.scheduler import ScheduledBatch
from inference.runner.model_loader import load_model
from inference.sampling.params import SamplingParams
from inference.spec.verify import expand


@pytest.fixture(scope="module")
def default_model() -> tuple:
    """The default model loaded once for the cases (seconds each: its GGUF's index is read
    again per load); each case builds its own engine on it, so no KV or cache state carries
    over."""
    return load_model(None, device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("proposed", [5, 12, 15])
def test_verify_rows_get_the_logits_of_decoding_each_position_alone(
    default_model: tuple, proposed: int
) -> None:
    engine = LLMEngine(EngineConfig(kv_cache_gb=0.05), loaded=default_model)
    request = engine.add_request(list(range(1000, 1200)), SamplingParams(temperature=0, max_tokens=4))
    engine.step()  # the prefill
    seq = request.seqs[0]
    assert engine.block_manager.allocate_slots(seq, proposed + 1)
    draft = [(17 * i + 5) % 4000 for i in range(proposed)]
    run = expand(ScheduledBatch(seqs=[seq], num_new_tokens=[1]), {0: draft}).run
    together, _ = engine.runner.execute(run)
    # Each row again on its own, over the K/V the verify step stored for the rows before it.
    alone = torch.cat(
        [engine.runner.execute(ScheduledBatch(seqs=[row], num_new_tokens=[1]))[0] for row in run.seqs]
    )
    assert together.shape == (proposed + 1, engine.model_config.vocab_size)
    assert torch.equal(together, alone)
