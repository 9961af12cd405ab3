"""The prompt for one answer: the conversation's history through the chat template.

Stored token ids of earlier turns are reused verbatim, so a conversation's next turn
hits the prefix cache; a history too long for the context loses its oldest turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings


@dataclass
class PromptPlan:
    token_ids: list[int]
    max_tokens: int
    dropped: int = 0  # history messages left out to fit the context
    user_segment: list[int] | None = None  # the last user turn's ids, to store on it
    # Leading ids every user may share in the prefix cache: the system prompt's segment.
    shared_prefix_tokens: int = 0


def chat_messages(system_prompt: str, history: list[dict]) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for item in history:
        message = {"role": item["role"], "content": item["content"]}
        ids = item.get("token_ids")
        # Stored ids are reused verbatim (an exact cache hit), except for the first message:
        # templates may put a default system prompt into its segment. An answer's ids hold
        # its reasoning, which must not go back to the model: its content alone is rendered.
        if ids and (item["role"] == "assistant" or messages) and not item.get("reasoning"):
            message["token_ids"] = ids
        messages.append(message)
    return messages


def build_prompt(tokenizer, system_prompt: str, history: list[dict], max_model_len: int, max_tokens: int):
    """The prompt ids for answering ``history`` (root first, ending with the question).

    A history too long for the context loses whole turns (a user message and its answers)
    from the oldest end; room for at least a quarter of the context (or ``max_tokens`` if
    smaller) is kept for the answer. Raises ``PromptTooLongError`` if even the last turn
    alone does not fit."""
    from inference import PromptTooLongError

    reserve = max(1, min(max_tokens, max_model_len // 4))
    budget = max_model_len - reserve
    turn_starts = [i for i, item in enumerate(history) if item["role"] == "user"] or [0]
    offset = 1 if system_prompt else 0
    start = 0
    while True:
        encoding = tokenizer.encode_chat_segments(chat_messages(system_prompt, history[start:]))
        ids = encoding.token_ids
        if len(ids) <= budget:
            break
        later = [s for s in turn_starts if s > start]
        if not later:
            raise PromptTooLongError(len(ids), budget)
        chosen = later[0]
        if encoding.exact:
            excess = len(ids) - budget
            for candidate in later:
                chosen = candidate
                segments = encoding.segments[offset : offset + candidate - start]
                if sum(len(seg) for seg in segments) >= excess:
                    break
        start = chosen
    user_segment = None
    if encoding.exact and history and history[-1]["role"] == "user" and len(history) - start + offset > 1:
        user_segment = list(encoding.segments[-1])
    return PromptPlan(
        token_ids=ids,
        max_tokens=max(1, min(max_tokens, max_model_len - len(ids))),
        dropped=start,
        user_segment=user_segment,
        shared_prefix_tokens=len(encoding.segments[0]) if system_prompt and encoding.exact else 0,
    )


def engine_options(owner_id: int, plan: PromptPlan) -> dict[str, Any]:
    """The engine's fair-share owner and prefix-cache salt for one user's answer: blocks
    after the shared system prompt are salted with the user (unless PREFIX_CACHE_SALT is
    off), so another user's time to first token cannot reveal this user's text."""
    return {"owner": f"user:{owner_id}", **cache_salt_options(owner_id, plan.shared_prefix_tokens)}


def cache_salt_options(owner_id: int, shared_prefix_tokens: int) -> dict[str, Any]:
    """The user's prefix-cache salt from the end of the shared system prompt on (also what
    KV retention must name, so it marks the same blocks)."""
    if not settings.PREFIX_CACHE_SALT:
        return {}
    return {"cache_salt": f"user:{owner_id}", "cache_salt_from": shared_prefix_tokens}
