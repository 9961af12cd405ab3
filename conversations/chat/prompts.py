"""The prompt for one answer: the conversation's history through the chat template.

Stored token ids of earlier turns are reused verbatim, so a conversation's next turn
hits the prefix cache. A history too long for the context loses its oldest turns; the
system prompt always stays. The cut moves in large steps (to about three quarters of the
room for history) and stays put while the turns after it fit, so consecutive turns share
their prompt as a prefix (``start_id`` in, ``PromptPlan.start_id`` out). Only the newest turns that can fit are rendered (the
history's length does not matter beyond that), and each render is linear in the
messages it holds (``inference.prompt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conversations.chat.cache_salt import cache_options
from inference.prompt import encode_segments
from inference.prompt.types import NATIVE_FIELDS

# Characters per token assumed for text without stored ids, when guessing how far back the
# context reaches. A guess that falls short only costs another render of a longer window.
CHARS_PER_TOKEN = 4
# Tokens a message's header and tail add around its content, for the same guess.
FRAME_TOKENS = 4
# When the history must be cut, it is cut down to this share of the room for history, so the
# next turns fit after the same cut (and hit the prefix cache) until that room is used up.
CUT_TARGET = 3 / 4


# A history item's tool fields (``Message`` columns): an answer's calls, a result's call.
TOOL_FIELDS = ("tool_calls", "tool_call_id", "tool_name")


@dataclass(frozen=True)
class ToolPrompt:
    """How a conversation with tools is rendered: the model's ``ToolFormat``
    (``inference.tools``) and the tools offered to this answer (OpenAI-shaped; empty once
    the rounds are used up or tools were turned off, though calls in the history still
    render as calls and results)."""

    format: Any
    tools: list[dict]

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools for the template's own ``tools`` (a native format), else None."""
        return self.tools or None if getattr(self.format, "native", False) else None

    def render(self, messages: list[dict]) -> list[dict]:
        """``messages`` in the format's shape, one for one, each keeping its stored ids only
        where the format left it as it was (an answer's ids hold its calls as generated). A
        native format's messages keep their native fields, and lose stored ids where they
        have any: the template writes those fields its own way."""
        rendered = self.format.render(messages, self.tools)
        if len(rendered) != len(messages):  # a format that merges or adds: one at a time
            first = self.format.render(messages[:1], self.tools)
            rendered = first[-1:] + [self.format.render([m], [])[-1] for m in messages[1:]]
        result = []
        for original, shaped in zip(messages, rendered, strict=True):
            plain = {"role": shaped["role"], "content": shaped.get("content") or ""}
            native = {k: shaped[k] for k in NATIVE_FIELDS if k in shaped}
            kept = not native and (
                plain["role"] == original["role"]
                and (plain["role"] == "assistant" or plain["content"] == original["content"])
            )
            if "token_ids" in original and kept:
                plain["token_ids"] = original["token_ids"]
            result.append({**plain, **native})
        return result


class NeedEarlierHistory(Exception):
    """The messages given may not reach back far enough to find where the prompt starts:
    read older ones (only when the caller said some exist, ``earlier > 0``)."""


@dataclass
class PromptPlan:
    token_ids: list[int]
    max_tokens: int
    dropped: int = 0  # history messages left out to fit the context
    user_segment: list[int] | None = None  # the last user turn's ids, to store on it
    # Leading ids every user may share in the prefix cache: the system prompt's segment.
    shared_prefix_tokens: int = 0
    exact: bool = True  # False: the template rewrites earlier turns, so no prefix is stable
    # The message the kept history starts with, once a cut was needed (None: nothing cut):
    # stored by the caller and passed back as ``start_id``, so the next turns keep the cut.
    start_id: int | None = None


def chat_messages(system_prompt: str, history: list[dict], tools: ToolPrompt | None = None) -> list[dict]:
    """OpenAI-shaped messages of the prompt; with ``tools``, always a system message (the
    format describes the tools there) and the calls and results in the format's shape."""
    with_system = system_prompt or (tools is not None and tools.tools)
    messages: list[dict] = [{"role": "system", "content": system_prompt}] if with_system else []
    for item in history:
        message = {"role": item["role"], "content": item["content"], **_tool_fields(item)}
        ids = item.get("token_ids")
        # Stored ids are reused verbatim (an exact cache hit), except for the first message:
        # templates may put a default system prompt into its segment. An answer's ids hold
        # its reasoning, which must not go back to the model: its content alone is rendered.
        if ids and (item["role"] == "assistant" or messages) and not item.get("reasoning"):
            message["token_ids"] = ids
        messages.append(message)
    return tools.render(messages) if tools is not None else messages


def _tool_fields(item: dict) -> dict:
    """An answer's calls (and the reasoning that led to them, as ``thinking``), a result's call."""
    if item.get("tool_calls"):
        calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in item["tool_calls"]
        ]
        return {"tool_calls": calls, **({"thinking": item["reasoning"]} if item.get("reasoning") else {})}
    if item["role"] == "tool":
        return {"tool_call_id": item.get("tool_call_id") or "", "name": item.get("tool_name") or ""}
    return {}


def estimated_tokens(item: dict) -> int:
    """A guess at the tokens ``item`` takes in a prompt, without rendering it."""
    ids = item.get("token_ids")
    if ids and not item.get("reasoning"):
        return len(ids) + FRAME_TOKENS
    return len(item["content"]) // CHARS_PER_TOKEN + FRAME_TOKENS


def build_prompt(
    tokenizer,
    system_prompt: str,
    history: list[dict],
    max_model_len: int,
    max_tokens: int,
    *,
    earlier: int = 0,
    add_generation_prompt: bool = True,
    start_id: int | None = None,
    tools: ToolPrompt | None = None,
) -> PromptPlan:
    """The prompt ids for answering ``history`` (oldest first, ending with the question).

    A history too long for the context loses whole turns (a user message and its answers)
    from the oldest end; the system prompt stays, and room for at least a quarter of the
    context (or ``max_tokens`` if smaller) is kept for the answer. Raises
    ``PromptTooLongError`` if even the system prompt and the last turn alone do not fit.
    ``earlier``: how many older messages of the conversation were left unread (counted
    in ``dropped``); raises :class:`NeedEarlierHistory` should they be needed.

    The cut is cache-stable: the prompt starts at message ``start_id`` (the previous turn's
    ``PromptPlan.start_id``) when it starts a turn of ``history`` and the history from it
    fits. Otherwise, when something must go, whole oldest turns go until the history takes
    at most ``CUT_TARGET`` of its room (the last turn always stays), and the plan's
    ``start_id`` names the new start. ``tools``: render the history and the offered tools
    in a tool format; the tool list then makes the system segment this user's own (not shared)."""
    reserve = max(1, min(max_tokens, max_model_len // 4))
    budget = max_model_len - reserve
    turn_starts = [i for i, item in enumerate(history) if item["role"] == "user"] or [0]
    offset = 1 if system_prompt or (tools is not None and tools.tools) else 0

    def encode(first: int):
        return encode_segments(
            tokenizer,
            chat_messages(system_prompt, history[first:], tools),
            add_generation_prompt,
            tools.template_tools if tools is not None else None,
        )

    anchored = _anchored(encode, history, turn_starts, start_id, budget)
    if anchored is not None:
        start, encoding = anchored
    else:
        start, encoding = _window(encode, history, turn_starts, budget, offset, earlier)
        start, encoding = _fit(encode, turn_starts, start, encoding, budget, budget, offset)
        if start or earlier:  # a cut was needed: make room for the next turns too
            target = int(budget * CUT_TARGET)
            start, encoding = _fit(encode, turn_starts, start, encoding, target, budget, offset)
    ids = encoding.token_ids
    cut = bool(start or earlier) and bool(history)
    user_segment = None
    if encoding.exact and history and history[-1]["role"] == "user" and len(history) - start + offset > 1:
        user_segment = list(encoding.segments[-1])
    return PromptPlan(
        token_ids=ids,
        max_tokens=max(1, min(max_tokens, max_model_len - len(ids))),
        dropped=earlier + start,
        user_segment=user_segment,
        shared_prefix_tokens=len(encoding.segments[0])
        if system_prompt and not tools and encoding.exact
        else 0,
        exact=encoding.exact,
        start_id=history[start].get("id") if cut else None,
    )


def _anchored(encode, history: list[dict], turn_starts: list[int], start_id: int | None, budget: int):
    """The start at message ``start_id`` and its encoding, if it starts a turn of ``history``
    (an edit or another branch leaves it off the path) and the prompt from it fits."""
    if start_id is None:
        return None
    start = next((i for i in turn_starts if history[i].get("id") == start_id), None)
    if start is None:
        return None
    encoding = encode(start)
    return (start, encoding) if len(encoding.token_ids) <= budget else None


def _fit(encode, turn_starts: list[int], start: int, encoding, budget: int, hard: int, offset: int):
    """The fewest oldest turns from ``start`` on dropped to fit ``budget``; the last turn
    stays even over ``budget`` if it fits ``hard`` (else ``PromptTooLongError``)."""
    from inference import PromptTooLongError

    while len(encoding.token_ids) > budget:
        later = [s for s in turn_starts if s > start]
        if not later:
            if len(encoding.token_ids) <= hard:
                return start, encoding  # only the target missed: the last turn fits
            raise PromptTooLongError(len(encoding.token_ids), hard)
        current, start = start, later[0]
        if encoding.exact:
            excess = len(encoding.token_ids) - budget
            for candidate in later:
                start = candidate
                if _dropped(encoding, offset, candidate - current) >= excess:
                    break
        encoding = encode(start)
    return start, encoding


def _window(encode, history: list[dict], turn_starts: list[int], budget: int, offset: int, earlier: int):
    """A turn to start rendering from, and its encoding, such that dropping turns from it
    ends where dropping them from the oldest message would: no turn before the next one
    can fit (or nothing older exists).

    The first guess comes from the stored ids' lengths; a window that turns out short is
    doubled (older turns are rendered only when the newer ones may all fit)."""
    goal = budget + budget // 5 + 64
    reach, k = 0, len(turn_starts) - 1
    ends = [*turn_starts[1:], len(history)]
    while k > 0 and reach <= goal:
        reach += sum(estimated_tokens(item) for item in history[turn_starts[k] : ends[k]])
        k -= 1
    step = 1
    while True:
        first = turn_starts[k] if k > 0 else 0
        if first == 0 and not earlier:
            return 0, encode(0)
        encoding = encode(first)
        if not encoding.exact and len(encoding.token_ids) > budget:
            return first, encoding  # no older start can fit either
        if (
            encoding.exact
            and k + 1 < len(turn_starts)
            and not _fits_from(encoding, offset, turn_starts[k + 1] - first, budget)
        ):
            return first, encoding
        if k == 0:
            raise NeedEarlierHistory
        k, step = max(0, k - step), step * 2


def _dropped(encoding, offset: int, count: int) -> int:
    """Tokens of the first ``count`` history messages of ``encoding``."""
    return sum(len(segment) for segment in encoding.segments[offset : offset + count])


def _fits_from(encoding, offset: int, skip: int, budget: int) -> bool:
    """Whether the prompt from ``skip`` messages into ``encoding`` on fits, judged by the
    segments those messages have after others (where every older start would have them)."""
    return len(encoding.token_ids) - _dropped(encoding, offset, skip) <= budget


def engine_options(owner_id: int, plan: PromptPlan, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """The engine's fair-share owner and prefix-cache salt for one user's answer: blocks
    after the shared system prompt are salted with the user (unless PREFIX_CACHE_SALT is
    off), so another user's time to first token cannot reveal this user's text. ``cache``:
    ``cache_salt_options`` for this plan, where the caller has them already."""
    if cache is None:
        cache = cache_salt_options(owner_id, plan.shared_prefix_tokens)
    return {"owner": f"user:{owner_id}", **cache}


def cache_salt_options(owner_id: int, shared_prefix_tokens: int) -> dict[str, Any]:
    """The user's prefix-cache namespace from the end of the shared system prompt on (also
    what KV retention must name, so it marks the same blocks): ``conversations.chat.cache_salt``."""
    return cache_options(owner_id, shared_prefix_tokens)
