"""Offline batch generation with vLLM's interface: ``LLM(...).generate(prompts, params)``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inference.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.outputs import CompletionOutput, RequestOutput
from inference.prompt import encode_chat
from inference.sampling.params import SamplingParams
from inference.tokenizer import Tokenizer

Prompt = str | list[int]

__all__ = ["LLM", "CompletionOutput", "RequestOutput"]


class LLM:
    def __init__(self, model: str | None = None, **config: Any) -> None:
        self.engine = LLMEngine(EngineConfig.from_kwargs(model=model, **config))

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt (text, already templated, or token ids) to completion;
        one output per prompt, in order. All prompts are checked before any runs."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        engine = self.engine
        encoded = [engine.encode_prompt(p) for p in prompts]
        for ids in encoded:
            engine.admission.check_prompt(ids)
        requests = []
        pending = list(zip(prompts, encoded, params, strict=True))
        pending.reverse()
        while pending or engine.has_unfinished():
            # Respect the waiting-queue limit by feeding prompts as room appears.
            while pending and engine.admission.has_room():
                prompt, ids, p = pending.pop()
                request = engine.add_request(ids, p)
                request.prompt = prompt if isinstance(prompt, str) else None
                requests.append(request)
            engine.step()
        return [engine.request_output(r) for r in requests]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them (chat template applied)."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else messages
        prompts = [
            encode_chat(self.tokenizer, conv, add_generation_prompt)  # type: ignore[arg-type]
            for conv in conversations
        ]
        return self.generate(prompts, sampling_params)
