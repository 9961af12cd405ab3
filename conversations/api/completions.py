"""From API requests to engine requests, and from engine deltas to OpenAI bodies (the
request's sampling parameters come from ``conversations.api.request_params``).

One ``Generation`` runs one API call: one engine request per prompt (chat has one,
a text completion may batch several), each with ``n`` completions. Choice ``i`` of
prompt ``p`` is choice ``p * n + i`` in the response, as in OpenAI's API.

Leaving ``Generation.deltas()`` early — the client went away and Django cancelled the
view or the streaming response — closes the engine streams and aborts the engine
requests, so their KV blocks are freed within one scheduler step.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from conversations.accounts import quota
from conversations.api.errors import ApiError, invalid, overloaded
from conversations.api.merged_streams import merge_streams
from conversations.api.request_params import invalid_prompt_token, param_from_message, prompt_too_long

log = logging.getLogger(__name__)


@dataclass
class ChoiceState:
    index: int
    text: list[str] = field(default_factory=list)
    num_output_tokens: int = 0
    finish_reason: str | None = None
    num_deltas: int = 0
    chars_before: int = 0  # characters of text before the latest delta
    reasoning: list[str] = field(default_factory=list)  # chat: <think> text, apart from the answer
    num_chars: int = 0  # characters of text so far (kept, not summed per delta)
    # (token id, {top id: logprob}) per generated token, when logprobs were asked for.
    logprobs: list[tuple[int, dict[int, float]]] = field(default_factory=list)


@dataclass
class PromptState:
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    # echo with logprobs: per prompt token {token id: logprob} (the first None).
    prompt_logprobs: list[dict[int, float] | None] | None = None


def assistant_message(content: str, reasoning: str) -> dict[str, Any]:
    """A chat choice's message; a reasoning model's thinking goes in ``reasoning_content``
    (DeepSeek's field), present only when there is some."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def new_response_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


class Generation:
    def __init__(
        self,
        engine: Any,
        *,
        kind: str,  # "chat" | "completion"
        prompts: list[list[int]],
        params: Any,
        prompt_param: str,
        top_logprobs: int | None = None,  # chat: how many alternatives per token (None: no logprobs)
        echo: list[str] | None = None,  # completions: prompt texts to prepend
        owner: str | None = None,  # the engine's fair-share owner (the API key)
        # The engine's cache options (conversations.chat.cache_salt.cache_options): the key
        # owner's namespace, with the body's cache_salt nested in it.
        cache: dict[str, Any] | None = None,
        # The owner's token budgets and fair-share weight (conversations.accounts.quota).
        admission: quota.Admission | None = None,
        model: str | None = None,  # the model id asked for (an adapter's); None: the engine's
        adapter: str | None = None,  # the LoRA adapter the engine runs, or None
    ) -> None:
        self.engine = engine
        self.kind = kind
        self.prompts = prompts
        self.params = params
        self.prompt_param = prompt_param
        self.n = params.n
        self.top_logprobs = top_logprobs
        self.echo = echo
        self.admission = admission
        self.engine_options = {
            "owner": owner,
            **(cache or {}),
            **(admission.engine_options() if admission else {}),
        }
        if adapter is not None:
            self.engine_options["adapter"] = adapter
        self.id = new_response_id(kind)
        self.created = int(time.time())
        self.model = model or engine.model_name
        self.request_ids = [self.id if len(prompts) == 1 else f"{self.id}-{i}" for i in range(len(prompts))]
        self.choices = [ChoiceState(i) for i in range(len(prompts) * self.n)]
        self.prompt_states = [PromptState() for _ in prompts]
        self.started_at = time.monotonic()
        self._token_text: dict[int, str] = {}
        self._finished: set[str] = set()  # request ids whose last delta came

    # ---- running ------------------------------------------------------------------
    async def deltas(self) -> AsyncIterator[tuple[ChoiceState, Any]]:
        """Engine deltas as (choice, delta), after updating the choice's state.

        The engine's errors before the first delta become API errors here."""
        streams: list[Any] = []
        try:
            for ids, rid in zip(self.prompts, self.request_ids, strict=True):
                streams.append(self.engine.stream(ids, self.params, request_id=rid, **self.engine_options))
            # One engine stream (every chat call) is read directly: one generator fewer per delta.
            single = len(streams) == 1
            async for item in streams[0] if single else merge_streams(streams):
                p, delta = (0, item) if single else item
                prompt = self.prompt_states[p]
                prompt.num_prompt_tokens = delta.num_prompt_tokens
                prompt.num_cached_tokens = delta.num_cached_tokens
                if delta.prompt_logprobs is not None:
                    prompt.prompt_logprobs = delta.prompt_logprobs
                choice = self.choices[p * self.n + delta.index]
                choice.chars_before = choice.num_chars
                choice.num_chars += len(delta.text)
                choice.num_deltas += 1
                choice.text.append(delta.text)
                if delta.reasoning:
                    choice.reasoning.append(delta.reasoning)
                choice.num_output_tokens = delta.num_output_tokens
                if delta.logprobs is not None:
                    choice.logprobs.extend(zip(delta.token_ids, delta.logprobs, strict=False))
                if delta.finished:
                    choice.finish_reason = delta.finish_reason
                if delta.request_finished:
                    self._finished.add(delta.request_id)
                yield choice, delta
            await self._settle_quota()
        except ApiError:
            raise
        except Exception as exc:
            error = self._engine_error(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            for stream in streams:
                with contextlib.suppress(Exception):
                    await stream.aclose()
            self.abort()

    async def _settle_quota(self) -> None:
        if self.admission is not None and self.admission.gate is not None:
            cached = sum(p.num_cached_tokens for p in self.prompt_states) * self.n
            await sync_to_async(quota.settle)(self.admission, cached)

    def abort(self) -> None:
        """Abort every engine request of this call that has not finished (a finished one's
        abort would only cost the engine thread a command)."""
        for rid in self.request_ids:
            if rid in self._finished:
                continue
            try:
                self.engine.abort(rid)
            except Exception:  # an unknown or finished id
                log.debug("abort of %s failed", rid, exc_info=True)

    def _engine_error(self, exc: Exception) -> Exception:
        from inference.errors import EngineOverloadedError, InvalidPromptError, PromptTooLongError

        if isinstance(exc, PromptTooLongError):
            return prompt_too_long(exc.num_tokens, exc.limit, self.engine.max_model_len, self.prompt_param)
        if isinstance(exc, InvalidPromptError):
            return invalid_prompt_token(exc.token_id, exc.vocab_size, self.prompt_param)
        if isinstance(exc, EngineOverloadedError):
            return overloaded()
        if isinstance(exc, ValueError):
            message = str(exc)
            param = param_from_message(message)
            if param not in {"n", "prompt", "stop", "max_tokens", "seed", "logprobs"}:
                param = self.prompt_param if "prompt" in message else None
            return invalid(message, param=param)
        return exc

    # ---- results ------------------------------------------------------------------
    @property
    def all_finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    @property
    def finish_reason(self) -> str:
        reasons = {c.finish_reason for c in self.choices if c.finish_reason}
        return ",".join(sorted(reasons))

    def usage(self) -> dict[str, Any]:
        prompt = sum(p.num_prompt_tokens for p in self.prompt_states)
        completion = sum(c.num_output_tokens for c in self.choices)
        cached = sum(p.num_cached_tokens for p in self.prompt_states)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def text_of(self, choice: ChoiceState) -> str:
        text = "".join(choice.text)
        if self.echo is not None:
            text = self.echo[choice.index // self.n] + text
        return text

    def response_body(self) -> dict[str, Any]:
        if self.kind == "chat":
            choices = [
                {
                    "index": c.index,
                    "message": assistant_message(self.text_of(c), "".join(c.reasoning)),
                    "logprobs": self.chat_logprobs(c.logprobs),
                    "finish_reason": c.finish_reason,
                }
                for c in self.choices
            ]
            kind = "chat.completion"
        else:
            choices = [
                {
                    "index": c.index,
                    "text": self.text_of(c),
                    "logprobs": self.completion_logprobs(
                        c.logprobs,
                        len(self.echo[c.index // self.n]) if self.echo else 0,
                        c.index // self.n if self.echo else None,
                    ),
                    "finish_reason": c.finish_reason,
                }
                for c in self.choices
            ]
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
            "system_fingerprint": None,
        }

    # ---- stream chunks --------------------------------------------------------------
    def chunk(self, choices: list[dict[str, Any]], include_usage: bool, usage: dict | None = None) -> dict:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if include_usage:
            body["usage"] = usage
        return body

    def opening_chunks(self) -> list[list[dict[str, Any]]]:
        """Chat: one chunk per choice whose delta carries the role."""
        if self.kind != "chat":
            return []
        return [
            [
                {
                    "index": c.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
            for c in self.choices
        ]

    def delta_chunks(self, choice: ChoiceState, delta: Any) -> list[list[dict[str, Any]]]:
        """The chunks (their ``choices`` lists) one engine delta turns into."""
        pairs = list(zip(delta.token_ids, delta.logprobs, strict=False)) if delta.logprobs is not None else []
        text = delta.text
        offset = choice.chars_before
        if self.echo is not None:
            echo = self.echo[choice.index // self.n]
            offset += len(echo)
            if choice.num_deltas == 1:
                text = echo + text
        out: list[list[dict[str, Any]]] = []
        if self.kind == "chat":
            if delta.reasoning:  # DeepSeek's stream: reasoning chunks carry no content
                out.append(
                    [
                        {
                            "index": choice.index,
                            "delta": {"reasoning_content": delta.reasoning},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
            if text or (pairs and not delta.reasoning):
                logprobs = self.chat_logprobs(pairs)
                out.append(
                    [
                        {
                            "index": choice.index,
                            "delta": {"content": text},
                            "logprobs": logprobs,
                            "finish_reason": None,
                        }
                    ]
                )
            if delta.finished:
                out.append(
                    [
                        {
                            "index": choice.index,
                            "delta": {},
                            "logprobs": None,
                            "finish_reason": delta.finish_reason,
                        }
                    ]
                )
        elif text or pairs or delta.finished:
            echoed = choice.index // self.n if self.echo is not None and choice.num_deltas == 1 else None
            out.append(
                [
                    {
                        "index": choice.index,
                        "text": text,
                        "logprobs": self.completion_logprobs(pairs, offset, echoed),
                        "finish_reason": delta.finish_reason if delta.finished else None,
                    }
                ]
            )
        return out

    # ---- logprobs --------------------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.engine.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text

    def _top_with(self, token_id: int, top: dict[int, float]) -> dict[str, float]:
        """A completion's ``top_logprobs`` entry: token text -> logprob. Two ids with the
        same text (rare byte-level pieces) keep the likelier's logprob."""
        entry: dict[str, float] = {}
        for tid, lp in _top_with_chosen(token_id, top, self.params.logprobs or 0):
            entry.setdefault(self.token_text(tid), _finite(lp))
        return entry

    def chat_logprobs(self, pairs: list[tuple[int, dict[int, float]]]) -> dict[str, Any] | None:
        if self.top_logprobs is None:
            return None
        content = []
        for token_id, top in pairs:
            token = self.token_text(token_id)
            best = sorted(top.items(), key=lambda kv: kv[1], reverse=True)[: self.top_logprobs]
            content.append(
                {
                    "token": token,
                    "logprob": _finite(top.get(token_id)),
                    "bytes": list(token.encode()),
                    "top_logprobs": [
                        {
                            "token": (t := self.token_text(tid)),
                            "logprob": _finite(lp),
                            "bytes": list(t.encode()),
                        }
                        for tid, lp in best
                    ],
                }
            )
        return {"content": content}

    def completion_logprobs(
        self, pairs: list[tuple[int, dict[int, float]]], offset: int, echoed: int | None = None
    ) -> dict[str, Any] | None:
        """OpenAI's completion logprobs of ``pairs`` (token id, its top ids -> logprob) whose
        text starts at ``offset``; ``echoed``: the prompt (its index) whose echo comes first,
        its tokens with their logprobs (the first token's null) from offset 0."""
        if self.params.logprobs is None:
            return None
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        text_offset: list[int] = []
        scores = self.prompt_states[echoed].prompt_logprobs if echoed is not None else None
        if echoed is not None and scores is not None:
            at = 0
            for token_id, top in zip(self.prompts[echoed], scores, strict=False):
                token = self.token_text(token_id)
                tokens.append(token)
                token_logprobs.append(None if top is None else _finite(top.get(token_id)))
                top_logprobs.append(None if top is None else self._top_with(token_id, top))
                text_offset.append(at)
                at += len(token)
        for token_id, top in pairs:
            token = self.token_text(token_id)
            tokens.append(token)
            token_logprobs.append(_finite(top.get(token_id)))
            top_logprobs.append(self._top_with(token_id, top))
            text_offset.append(offset)
            offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": text_offset,
        }


def _top_with_chosen(token_id: int, top: dict[int, float], k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens and the chosen one (OpenAI's up to ``k + 1``), best first."""
    best = sorted(top.items(), key=lambda kv: kv[1], reverse=True)[:k]
    if token_id in top and all(tid != token_id for tid, _ in best):
        best.append((token_id, top[token_id]))
    return best


def _finite(value: float | None) -> float:
    """JSON has no -inf; OpenAI reports -9999.0 for impossible tokens."""
    if value is None or value != value or value == float("-inf"):
        return -9999.0
    return float(value)
