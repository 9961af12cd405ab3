"""DeepSeek-V3 (MLA + MoE) against transformers' ``DeepseekV3ForCausalLM`` on tiny
random checkpoints: logits, greedy tokens, the engine's batching/chunking/prefix
cache, the latent pool's size, and refusal of what we do not implement."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import inference.layers.mla_attention as mla_attention
from inference.engine.llm_engine import LLMEngine
from inference.errors import UnsupportedModelError
from inference.layers.moe import TopkRouter
from inference.models import DeepseekV3ForCausalLM, LlamaForCausalLM, kv_spec_for
from inference.models.registry import read_model_config
from inference.runner.model_loader import load_model
from tests.engine.engine_fixtures import TinyModel, greedy, random_prompts, run_to_completion
from tests.support.fakes import PagedSequenceRunner, greedy_generate, make_tiny_model_dir, tiny_hf_config

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "mscale": 1.0,
    "mscale_all_dim": 0.707,  # != mscale: both the cos/sin factor and the softmax scale change
    "beta_fast": 32,
    "beta_slow": 1,
}
# name -> config overrides (on top of tests.support.fakes.TINY_DEEPSEEK_DEFAULTS)
VARIANTS: dict[str, dict[str, Any]] = {
    "q-lora": {},
    "direct-q-yarn": {"q_lora_rank": None, "rope_parameters": YARN, "norm_topk_prob": False},
}


@dataclass
class DeepseekPair(TinyModel):
    ours: DeepseekV3ForCausalLM | None = None

    def engine(self, **overrides: Any) -> LLMEngine:
        defaults = {"num_kv_blocks": 128, "max_num_batched_tokens": 512, "max_num_seqs": 16}
        return super().engine(**{**defaults, **overrides})


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("deepseek-tiny")
    cache: dict[str, DeepseekPair] = {}

    def get(name: str) -> DeepseekPair:
        if name not in cache:
            seed = list(VARIANTS).index(name) + 11
            path = make_tiny_model_dir(root / name, arch="deepseek_v3", seed=seed, **VARIANTS[name])
            loaded = load_model(path, device="cpu")
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            hf.generation_config.eos_token_id = None  # fixed-length greedy runs
            hf.generation_config.pad_token_id = 0
            cache[name] = DeepseekPair(path=str(path), loaded=loaded, hf=hf, ours=loaded[0])
        return cache[name]

    return get


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_log_softmax_equals_transformers_through_prefill_chunks_and_absorbed_decodes(
    deepseek, variant
) -> None:
    pair = deepseek(variant)
    rng = random.Random(3)
    ids = [rng.randrange(100, 40000) for _ in range(41)]
    other = list(range(500, 530))
    with torch.no_grad():
        ref = pair.hf(torch.tensor([ids])).logits[0].log_softmax(-1)
    runner = PagedSequenceRunner(pair.ours, num_blocks=32, block_size=4, shuffle=True)
    a, b = runner.add_sequence(), runner.add_sequence()
    got = [runner.step([ids[:13], other])[:13]]  # a fresh prefill beside another sequence
    got.append(runner.step([ids[13:30], []]))  # a chunk over a cached prefix (expanded)
    for t in ids[30:]:  # decode steps, batched with the other sequence's decodes (absorbed)
        got.append(runner.step([[t], [7]])[a : a + 1])
    ours = torch.cat(got).log_softmax(-1)
    assert b == 1 and ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-3
    assert ours.argmax(-1).unique().numel() > 10  # the random model is not a constant


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_tokens_equal_transformers_for_8_prompts_decoded_together(deepseek, variant) -> None:
    pair = deepseek(variant)
    tokenizer = pair.loaded[1]
    prompts = random_prompts(tokenizer, 8, seed=4, min_len=4, max_len=30)
    ours = greedy_generate(pair.ours, prompts, max_new_tokens=6, block_size=8, shuffle=True, prefill_chunk=9)
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert tokens == pair.hf_greedy(prompt, 6)
    assert len({t for tokens in ours for t in tokens}) > 8  # not one token repeated


def test_engine_output_is_the_same_alone_batched_chunked_and_from_the_prefix_cache(deepseek) -> None:
    pair = deepseek("q-lora")
    prompts = random_prompts(pair.loaded[1], 9, seed=6, min_len=10, max_len=50)
    prompts[4] = prompts[0][:32] + prompts[4]  # a shared prefix of two whole 16-token blocks
    alone = run_to_completion(pair.engine(), [prompts[0]], greedy(12))[0].token_ids
    rng = random.Random(7)
    arrivals = [0] + [rng.randrange(0, 12) for _ in range(8)]
    engine = pair.engine(max_num_batched_tokens=20)  # prefills are chunked and mixed with decodes
    together = run_to_completion(engine, prompts, greedy(12), arrivals)
    assert together[0].token_ids == alone
    for i in (4, 7):  # a prompt that shared its prefix, and a late arrival
        assert (
            together[i].token_ids == run_to_completion(pair.engine(), [prompts[i]], greedy(12))[0].token_ids
        )
    again = run_to_completion(engine, [prompts[0]], greedy(12))[0]
    assert again.num_cached_tokens >= 32 and again.token_ids == alone


def test_decode_steps_read_the_latent_without_expanding_it(deepseek, monkeypatch) -> None:
    pair = deepseek("q-lora")
    runner = PagedSequenceRunner(pair.ours, num_blocks=8, block_size=4)
    runner.add_sequence()
    runner.step([list(range(200, 210))])

    def expand(*args: Any) -> None:
        raise AssertionError("a decode step expanded the latent through kv_b_proj")

    monkeypatch.setattr(mla_attention, "mla_prefill", expand)
    assert runner.step([[5]]).shape[0] == 1


def test_pool_bytes_per_token_per_layer_are_the_latent_size(deepseek) -> None:
    pair = deepseek("q-lora")
    mc = pair.loaded[2]
    engine = pair.engine(num_kv_blocks=10, block_size=16)
    pool = engine.runner.kv_cache
    per_token_per_layer = pool[0].numel() * pool.element_size() // (16 * mc.num_layers)
    latent = mc.mla.kv_lora_rank + mc.mla.qk_rope_head_dim
    assert pool.shape == (10, 1, mc.num_layers, 16, latent)
    assert per_token_per_layer == latent * 4 == engine.kv_spec.bytes_per_token(torch.float32) // mc.num_layers
    assert per_token_per_layer < 2 * mc.num_heads * mc.mla.v_head_dim * 4  # far below K + V per head


def test_llama_kv_spec_keeps_k_and_v_per_kv_head() -> None:
    config = read_model_config(tiny_hf_config("llama"))
    spec = kv_spec_for(config)
    assert spec == LlamaForCausalLM.kv_spec_for(config)
    assert spec.block_shape(16) == (2, config.num_layers, 16, config.num_kv_heads, config.head_dim)
    assert (
        spec.bytes_per_token(torch.bfloat16)
        == 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2
    )


def test_router_picks_experts_only_inside_the_best_groups() -> None:
    config = read_model_config(tiny_hf_config("deepseek_v3"))
    router = TopkRouter(config, config.moe)
    torch.nn.init.normal_(router.weight)
    weights, ids = router(torch.randn(64, config.hidden_size))
    per_group = config.moe.num_experts // config.moe.num_groups
    groups_used = [len(set((row // per_group).tolist())) for row in ids]
    assert max(groups_used) <= config.moe.topk_groups and ids.shape == (64, config.moe.top_k)
    assert torch.allclose(weights.sum(-1), torch.full((64,), config.moe.routed_scaling_factor))


@pytest.mark.parametrize(
    ("feature", "value"),
    [("topk_method", "group_limited_greedy"), ("scoring_func", "softmax"), ("moe_layer_freq", 2)],
)
def test_unsupported_deepseek_feature_is_refused_at_load_naming_it(tmp_path, feature, value) -> None:
    tiny_hf_config("deepseek_v3").save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw[feature] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedModelError, match=feature):
        load_model(tmp_path, device="cpu")


def test_an_fp8_checkpoint_is_refused_naming_its_quantisation(tmp_path) -> None:
    tiny_hf_config("deepseek_v3").save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedModelError, match="fp8"):
        load_model(tmp_path, device="cpu")
