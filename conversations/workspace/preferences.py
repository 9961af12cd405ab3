"""Rated answers as JSONL for preference tuning (the admin's export).

One line per rated answer (``"type": "rating"``) and one per pair of sibling answers to
the same question, one rated up and one rated down (``"type": "pair"``: ``chosen`` and
``rejected``), as regenerating an answer makes. Each line carries the ``prompt`` the
answer was written for: the system prompt and the messages from the root down to the
question, as ``{"role", "content"}``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator

from conversations.chat.tree import path_rows
from conversations.models import Message, Rating


def _prompt(message: Message, cache: dict) -> list[dict]:
    key = message.parent_id
    if key not in cache:
        conversation = message.conversation
        rows = path_rows(conversation.pk, message.parent_id, "role", "content")
        system = (
            [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
        )
        cache[key] = system + [{"role": role, "content": content} for _id, role, content in rows]
    return cache[key]


def preference_lines(ratings: Iterable[Rating]) -> Iterator[dict]:
    # A temporary chat's answers are never exported, whatever rated them.
    ratings = [r for r in ratings if not r.message.conversation.temporary]
    cache: dict = {}
    by_question: dict[int, dict[int, list[Rating]]] = defaultdict(lambda: defaultdict(list))
    for rating in ratings:
        message = rating.message
        yield {
            "type": "rating",
            "conversation_id": message.conversation_id,
            "message_id": message.pk,
            "model": message.model_name,
            "rating": rating.value,
            "reason": rating.reason,
            "prompt": _prompt(message, cache),
            "completion": message.content,
        }
    # Pairs: the questions of the exported ratings, with every rated answer to each (a
    # filtered export keeps the pairs its answers belong to).
    questions = {r.message.parent_id for r in ratings if r.message.parent_id is not None}
    siblings = Rating.objects.filter(
        message__parent_id__in=questions, message__conversation__temporary=False
    ).select_related("message", "message__conversation")
    for rating in siblings.order_by("message__created_at", "message_id"):
        by_question[rating.message.parent_id][rating.value].append(rating)
    for votes in by_question.values():
        for up in votes[Rating.Value.UP]:
            for down in votes[Rating.Value.DOWN]:
                yield {
                    "type": "pair",
                    "conversation_id": up.message.conversation_id,
                    "prompt": _prompt(up.message, cache),
                    "chosen": up.message.content,
                    "rejected": down.message.content,
                    "chosen_message_id": up.message_id,
                    "rejected_message_id": down.message_id,
                    "chosen_reason": up.reason,
                    "rejected_reason": down.reason,
                }


def render_jsonl(ratings: Iterable[Rating]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in preference_lines(ratings)).encode()
