"""Per-request sampling options, with vLLM's field names and validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Temperatures below this are treated as greedy: dividing logits by ~0 overflows.
GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20
LOGIT_BIAS_BOUND = 100.0  # OpenAI's range: -100 bans a token, 100 all but forces it
# Stop strings per request and characters per stop string. Every stop string is matched
# against the new text of every sequence at each step on the engine thread, so their
# number and length bound per-step work: four is OpenAI's limit and vLLM's default
# (``VLLM_MAX_STOP_STRINGS``); a stop string is a short marker, never a passage.
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 1024


@dataclass
class SamplingParams:
    n: int = 1  # completions returned
    best_of: int | None = None  # beam search: beams kept (vLLM's name); defaults to n
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # >1 discourages tokens seen in prompt or output
    presence_penalty: float = 0.0  # subtracted once from tokens already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    max_tokens: int | None = 16  # None = until the context is full; 0: score the prompt only
    min_tokens: int = 0  # vLLM's: EOS and stop tokens are masked (stop strings unchecked) until then
    ignore_eos: bool = False
    stop: str | list[str] | None = None  # stop strings; not included in the output text
    stop_token_ids: list[int] | None = None  # extra token ids that end a completion
    include_stop_str_in_output: bool = False
    seed: int | None = None  # per request: same seed, same output, whatever else runs
    logprobs: int | None = None  # top logprobs returned per generated token
    # Top logprobs per prompt token (vLLM's name): the prompt's logits are computed for
    # this request, which therefore bypasses the prefix cache (cached tokens have none).
    prompt_logprobs: int | None = None
    # Token id -> bias added to its logit before sampling (OpenAI's ``logit_bias``).
    logit_bias: dict[int, float] | None = None
    use_beam_search: bool = False
    beam_width: int | None = None  # alias of best_of for beam search
    length_penalty: float = 1.0  # beam score = cumulative logprob / length ** length_penalty
    # Chat: split <think>…</think> off into StreamDelta.reasoning when the model's template
    # marks reasoning (inference.sampling.reasoning_parser); raw completions keep the text whole.
    separate_reasoning: bool = False
    # inference.structured.GrammarSpec: the output must match it (JSON schema, regex, EBNF...).
    grammar: Any = None
    # Derived, not options: whether the logits need ``logit_bias`` / ``min_tokens`` edits
    # (read for every row of every step), and those edits as tensors once built
    # (``inference.sampling.logit_rules``).
    edits_logits: bool = field(default=False, init=False, repr=False, compare=False)
    token_edits: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None:
            self.logit_bias = {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None
        if self.top_k == -1:
            self.top_k = 0
        if self.use_beam_search and self.beam_width is None:
            self.beam_width = max(self.n, self.best_of or self.n)
        self._validate()
        self.edits_logits = bool(self.logit_bias) or self.min_tokens > 0

    def _validate(self) -> None:
        def check(ok: bool, field: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{field} must be {rule}, got {getattr(self, field)!r}")

        check(_is_int(self.n) and self.n >= 1, "n", "an integer >= 1")
        check(self.best_of is None or (_is_int(self.best_of) and self.best_of >= self.n), "best_of", ">= n")
        check(_is_num(self.temperature) and self.temperature >= 0, "temperature", "non-negative")
        check(_is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]")
        check(_is_int(self.top_k) and self.top_k >= 0, "top_k", "-1, 0 (disabled) or a positive integer")
        check(_is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]")
        check(_is_num(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty", "> 0")
        check(
            _is_num(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
            "presence_penalty",
            "in [-2, 2]",
        )
        check(
            _is_num(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
            "frequency_penalty",
            "in [-2, 2]",
        )
        check(
            self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 0),
            "max_tokens",
            ">= 0",
        )
        check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "an integer >= 0")
        check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            "<= max_tokens",
        )
        check(
            self.prompt_logprobs is None
            or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
            "prompt_logprobs",
            f"None or an integer in [0, {MAX_LOGPROBS}]",
        )
        check(
            self.logit_bias is None
            or all(
                k >= 0 and _is_num(v) and -LOGIT_BIAS_BOUND <= v <= LOGIT_BIAS_BOUND
                for k, v in self.logit_bias.items()
            ),
            "logit_bias",
            f"token ids mapped to biases in [-{LOGIT_BIAS_BOUND:g}, {LOGIT_BIAS_BOUND:g}]",
        )
        check(not (self.use_beam_search and self.max_tokens == 0), "max_tokens", ">= 1 with use_beam_search")
        check(all(isinstance(s, str) and s for s in self.stop), "stop", "non-empty strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        longest = max(map(len, self.stop), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"a stop string may be at most {MAX_STOP_CHARS} characters long, got {longest}")
        check(all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids", "token ids")
        check(self.seed is None or _is_int(self.seed), "seed", "an integer or None")
        check(
            self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
            "logprobs",
            f"None or an integer in [0, {MAX_LOGPROBS}]",
        )
        check(
            self.beam_width is None or (_is_int(self.beam_width) and self.beam_width >= self.n),
            "beam_width",
            ">= n",
        )
        check(_is_num(self.length_penalty), "length_penalty", "a number")
        check(not (self.use_beam_search and self.stop), "stop", "empty with use_beam_search")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def width(self) -> int:
        """Sequences this request runs at once: beams, or n parallel samples."""
        return self.beam_width if self.use_beam_search else self.n  # type: ignore[return-value]

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value  # NaN fails
