"""Prompt ids for a conversation, stable across turns, in time linear in its messages.

Multi-turn prefix caching only works if turn N+1's prompt ids start with turn N's prompt
and generated ids *exactly* (vllm#4917 shows what happens otherwise). Re-rendering the
whole conversation and re-tokenising does not guarantee that: the model's own tokens may
not be the canonical tokenisation of their text, and BPE merges can cross turn boundaries.
So each message's segment of the render (``inference.prompt.layout``) is tokenised on its
own, and stored ids are reused verbatim.

The segments come from the marked layout (a few renders of the whole list, for templates
that copy contents verbatim), else from short local probes (``inference.prompt.local``);
a template that rewrites earlier turns gets the whole render, tokenised at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.prompt.layout import Layout, marked_layout, render
from inference.prompt.local import local_layout
from inference.prompt.types import ChatEncoding, ChatTokenizer, Message, Tools, WithTools


def encode_chat(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    tools: Tools | None = None,
) -> list[int]:
    """The prompt ids of ``messages`` (see :func:`encode_segments`)."""
    return encode_segments(tokenizer, messages, add_generation_prompt, tools).token_ids


def encode_segments(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    tools: Tools | None = None,
) -> ChatEncoding:
    """Each message's ids apart (for storing per message), and the generation prompt's.

    A message may carry ``"token_ids"``: for an assistant message, the ids the model
    generated for it (with or without its final end-of-turn token); for any other role,
    that message's segment ids as returned earlier. They are used verbatim, so the
    encoding of ``history + [reply, next_user]`` starts with that of ``history`` plus
    ``reply``'s ids. Role, content and the native fields (``NATIVE_FIELDS``) reach the
    template, and ``tools`` (OpenAI-shaped) as its ``tools``."""
    if tools:
        tokenizer = WithTools(tokenizer, tools)
    if not messages:
        opening = render_prompt(tokenizer, [], add_generation_prompt)
        return ChatEncoding(generation_prompt=tokenizer.encode(opening) if opening else [])
    text = render(tokenizer, messages)
    before = render(tokenizer, messages[:-1])
    layout = None
    if text.startswith(before):  # else the template rewrites earlier turns: no stable prefix
        layout = marked_layout(tokenizer, messages, text, before)
        layout = layout or local_layout(tokenizer, messages, text, before)
    if layout is None:
        whole = render_prompt(tokenizer, messages, add_generation_prompt)
        return ChatEncoding(segments=[tokenizer.encode(whole)], exact=False)
    result = ChatEncoding(segments=_segments(tokenizer, messages, layout))
    if add_generation_prompt:
        full = render_prompt(tokenizer, messages, True)
        result.generation_prompt = tokenizer.encode(full[len(text) :])
    return result


def render_prompt(tokenizer: ChatTokenizer, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


def _segments(tokenizer: ChatTokenizer, messages: Sequence[Message], layout: Layout) -> list[list[int]]:
    """Each message's ids: its stored ones, else its text in ``layout`` tokenised. Every text
    goes to the tokenizer in one batch, each once (an answer's header and tail repeat)."""
    texts: dict[str, int] = {}

    def slot(text: str) -> int:
        return texts.setdefault(text, len(texts))

    # Per message, its parts in order: an index into ``texts``, or ids to use as they are.
    recipes: list[list[int | list[int]]] = []
    for i, message in enumerate(messages):
        stored = message.get("token_ids")
        if stored is None:
            recipes.append([slot(layout.text[layout.bounds[i] : layout.bounds[i + 1]])])
            continue
        ids = [int(t) for t in stored]
        frame = layout.frames[i]
        if message["role"] != "assistant" or frame is None:
            recipes.append([ids])  # a stored segment, or an answer whose content the template hides
            continue
        tail = _tail_after(tokenizer, frame[1], ids)
        recipes.append([slot(frame[0]), ids, *([slot(tail)] if tail else [])])
    encoded = tokenizer.encode_batch(list(texts)) if texts else []
    return [
        [t for part in recipe for t in (encoded[part] if isinstance(part, int) else part)]
        for recipe in recipes
    ]


def _tail_after(tokenizer: ChatTokenizer, tail: str, generated: list[int]) -> str:
    """What the template writes after an answer's content, less the end-of-turn token the
    tail starts with (``<|im_end|>`` in ChatML) if the generated ids already end with it."""
    if generated and generated[-1] in tokenizer.eos_token_ids:
        end_text = tokenizer.token_text(generated[-1])
        if tail.startswith(end_text):
            return tail[len(end_text) :]
    return tail
