"""A JSON-schema response on a hybrid model: a tiny random Qwen3.5 with SmolLM2's
vocabulary (so the grammar's tokens are the model's), its constrained greedy tokens
equal to greedy decoding of transformers' logits under the same grammar's mask, and the
text valid against the schema."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import jsonschema
import torch

from inference.config import EngineConfig
from inference.engine.llm import LLM
from inference.engine.llm_engine import LLMEngine
from inference.models.registry import read_model_config
from inference.sampling.params import SamplingParams
from inference.structured import GrammarSpec, SequenceGrammar, apply_grammar_masks
from inference.tokenizer import Tokenizer
from tests.support.fakes import smollm2_tokenizer_dir
from tests.support.hybrid_models import hybrid_config, make_hybrid_pair

VOCAB = 49152  # SmolLM2's tokenizer
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}


def _hf_constrained_greedy(
    hf: torch.nn.Module, prompt: list[int], grammar: SequenceGrammar, max_tokens: int, eos: frozenset[int]
) -> list[int]:
    """Greedy over HF's logits with the grammar's mask applied at every step."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = hf(torch.tensor([ids])).logits[0, -1:].float()
            token = int(apply_grammar_masks(logits, [SimpleNamespace(grammar=grammar)])[0].argmax())
            out.append(token)
            if token in eos:
                break
            assert grammar.accept(token)
            ids.append(token)
    return out


def test_json_schema_response_equals_masked_transformers_greedy() -> None:
    from transformers import AutoTokenizer

    hf, ours = make_hybrid_pair("qwen3_5", seed=1, vocab_size=VOCAB)
    config = dataclasses.replace(read_model_config(hybrid_config("qwen3_5", vocab_size=VOCAB)), name="tiny")
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
    llm = LLM.__new__(LLM)
    engine_config = EngineConfig(device="cpu", num_kv_blocks=64, max_num_batched_tokens=32)
    llm.engine = LLMEngine(engine_config, loaded=(ours, tokenizer, config))  # type: ignore[arg-type]
    spec = GrammarSpec.json_schema(SCHEMA)
    prompt = tokenizer.encode("Describe the record as JSON, with a short name and a flag: " * 3)
    assert len(prompt) > 32  # a chunked prompt: the state continues across the chunks
    out = llm.generate(prompt, SamplingParams(max_tokens=60, temperature=0.0, grammar=spec))[0].outputs[0]
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(out.text), SCHEMA)
    grammar = SequenceGrammar(llm.engine.grammars.submit(spec))
    expected = _hf_constrained_greedy(hf, prompt, grammar, 60, llm.engine.eos_token_ids)
    assert out.token_ids == expected[: len(out.token_ids)] and len(expected) - len(out.token_ids) <= 1
