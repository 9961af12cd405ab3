"""Short titles written by the model after a conversation's first answer.

The flow, with a real worker (``REDIS_URL`` set):

1. A site process finishes a conversation's first answer and calls :func:`answer_finished`
   (on its event loop; nothing there blocks). That enqueues ``conversations.tasks.generate_title``
   after the commit (``conversations.enqueue``) and makes sure the process serves title requests
   (:func:`ensure_title_service`).
2. The worker loads the first exchange and asks *a live site process's* engine for a title
   through the channel layer: it sends the prompt to the shared channel ``engine.titles``,
   which any site process serving it may take, and waits for the reply on a channel of its
   own. The worker never loads a model. When no site process answers within
   ``TITLE_REPLY_SECONDS`` the task retries ``TITLE_RETRY_SECONDS`` later.
3. The title is stored only while ``title_source`` is still ``auto`` (a title the user set
   stays theirs), then announced: ``conversations`` to the owner's tabs (the sidebar reloads)
   and ``title {conversation_id, title}`` to the tabs showing that conversation.

Under the embedded defaults (eager Celery, in-memory layer) the task runs inside the site
process, off the event loop, and uses that process's engine directly.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
import weakref
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import close_old_connections, connections

from conversations.chat.groups import broadcast, conversation_group, user_group
from conversations.chat.tree import Tree
from conversations.enqueue import GENERATE_TITLE, enqueue_on_commit
from conversations.models import Conversation, Message
from conversations.ops.engine_handle import aget_engine, engine_status

log = logging.getLogger(__name__)

TITLE_CHANNEL = "engine.titles"
MAX_TITLE_WORDS = 8
MAX_TITLE_TOKENS = 24
# The exchange is cut to this many characters per side: the start says what it is about.
EXCERPT_CHARS = 1200
INSTRUCTION = (
    "Write a short title (at most 8 words) for the conversation below. "
    "Reply with the title only: no quotes, no punctuation at the end."
)


class NoLiveEngine(Exception):
    """No site process with an engine answered: try again later."""


class TitleFailed(Exception):
    """A site process answered with an error: retrying would not help."""


# --- Plain logic ---------------------------------------------------------------------


def title_messages(question: str, answer: str) -> list[dict]:
    exchange = f"User: {question.strip()[:EXCERPT_CHARS]}\n\nAssistant: {answer.strip()[:EXCERPT_CHARS]}"
    return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": exchange}]


def clean_title(text: str) -> str:
    """The model's reply as a title: its first line, without a "Title:" label, quotes or
    Markdown marks, at most ``MAX_TITLE_WORDS`` words. '' if nothing is left."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = re.sub(r"^\s*title\s*[:\-–]\s*", "", line, flags=re.IGNORECASE)
    line = re.sub(r"[`*_#>\[\]\"“”«»]+", "", line)
    words = line.split()[:MAX_TITLE_WORDS]
    return " ".join(words).strip(" .,;:!-–'")[:200]


def is_first_answer(message_id: int) -> bool:
    """``message_id`` answers a first message, in a conversation whose title the model may write."""
    return Message.objects.filter(
        pk=message_id,
        role=Message.Role.ASSISTANT,
        parent__isnull=False,
        parent__parent__isnull=True,
        conversation__title_source=Conversation.TitleSource.AUTO,
        conversation__deleted_at__isnull=True,
    ).exists()


def first_exchange(conversation_id: int) -> tuple[str, str] | None:
    """The shown thread's first question and its complete answer, if the title is still the
    model's to write."""
    if not Conversation.objects.filter(
        pk=conversation_id, title_source=Conversation.TitleSource.AUTO
    ).exists():
        return None
    return first_exchange_any(conversation_id)


def first_exchange_any(conversation_id: int) -> tuple[str, str] | None:
    """The shown thread's first question and its complete answer, whoever titled it."""
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None:
        return None
    thread = Tree.load(conversation).thread()
    if len(thread) < 2:
        return None
    question, answer = thread[0], thread[1]
    if question.role != Message.Role.USER or answer.role != Message.Role.ASSISTANT:
        return None
    if answer.status != Message.Status.COMPLETE or not answer.content.strip():
        return None
    return question.content, answer.content


def save_title(conversation_id: int, title: str) -> bool:
    """Store ``title`` unless the user set one meanwhile, and announce it. Synchronous."""
    updated = Conversation.objects.filter(
        pk=conversation_id, title_source=Conversation.TitleSource.AUTO
    ).update(title=title, title_source=Conversation.TitleSource.MODEL)
    if not updated:
        return False
    owner_id = Conversation.objects.filter(pk=conversation_id).values_list("owner_id", flat=True).first()
    if owner_id is not None:
        async_to_sync(broadcast)(user_group(owner_id), "conversations")
    async_to_sync(broadcast)(
        conversation_group(conversation_id), "title", conversation_id=conversation_id, title=title
    )
    return True


# --- Asking an engine ------------------------------------------------------------------


async def generate_with_engine(engine: Any, messages: list[dict]) -> str:
    """Greedy, short: the same title for the same exchange."""
    from inference import SamplingParams

    ids = await asyncio.to_thread(engine.tokenizer.encode_chat, messages)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TITLE_TOKENS)
    text = ""
    stream = engine.stream(ids, params, request_id=f"title-{uuid.uuid4().hex[:12]}")
    try:
        async for delta in stream:
            text += delta.text
            if delta.finished:
                break
    finally:
        await stream.aclose()
    return text


async def ask_site(messages: list[dict], timeout: float) -> str:
    """A title from whichever site process takes the request off ``engine.titles``."""
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        raise NoLiveEngine("no channel layer shared with the site processes")
    reply_channel = await layer.new_channel("titles.reply")
    await layer.send(
        TITLE_CHANNEL,
        {
            "type": "title.request",
            "reply_channel": reply_channel,
            "messages": messages,
            "deadline": time.time() + timeout,
        },
    )
    try:
        reply = await asyncio.wait_for(layer.receive(reply_channel), timeout)
    except TimeoutError:
        raise NoLiveEngine(f"no site process answered within {timeout:g} s") from None
    if reply.get("error"):
        raise TitleFailed(reply["error"])
    return str(reply.get("text", ""))


async def _title_text(messages: list[dict], local_only: bool) -> str:
    if engine_status()["ready"]:  # this process is a site process with its engine loaded
        return await generate_with_engine(await aget_engine(), messages)
    if local_only:
        raise NoLiveEngine("this process has no engine loaded")
    return await ask_site(messages, settings.TITLE_REPLY_SECONDS)


def write_title(conversation_id: int, local_only: bool = False) -> str | None:
    """The task's work: the title written and announced, or None when there is nothing to do
    (the user set a title, the conversation is gone, the model wrote nothing usable).
    Raises :class:`NoLiveEngine` when no engine could be asked."""
    exchange = first_exchange(conversation_id)
    if exchange is None:
        return None
    title = clean_title(async_to_sync(_title_text)(title_messages(*exchange), local_only))
    if not title:
        log.info("the model wrote no usable title for conversation %s", conversation_id)
        return None
    return title if save_title(conversation_id, title) else None


# --- The site process's side -------------------------------------------------------------

_services: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task] = weakref.WeakKeyDictionary()
_pending: set[asyncio.Task] = set()


def _keep(task: asyncio.Task) -> None:
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def ensure_title_service() -> None:
    """Serve title requests from workers on this event loop (once per loop). Only with a
    shared layer: under the in-memory one the eager task uses this process's engine itself."""
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return
    loop = asyncio.get_running_loop()
    task = _services.get(loop)
    if task is None or task.done():
        _services[loop] = loop.create_task(_serve(layer), name="title-service")


async def _serve(layer) -> None:
    while True:
        try:
            request = await layer.receive(TITLE_CHANNEL)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("title service: receive failed", exc_info=True)
            await asyncio.sleep(1.0)
            continue
        _keep(asyncio.get_running_loop().create_task(_answer(layer, request)))


async def _answer(layer, request: dict) -> None:
    reply_channel = request.get("reply_channel")
    messages = request.get("messages")
    if not isinstance(reply_channel, str) or not isinstance(messages, list):
        return
    if float(request.get("deadline") or 0) < time.time():
        return  # the worker gave up on it
    try:
        text = await generate_with_engine(await aget_engine(), messages)
        reply = {"type": "title.reply", "text": text}
    except Exception as exc:
        log.warning("title generation failed", exc_info=True)
        reply = {"type": "title.reply", "error": f"{type(exc).__name__}: {exc}"}
    try:
        await layer.send(reply_channel, reply)
    except Exception:
        log.warning("title reply could not be sent", exc_info=True)


def answer_finished(conversation_id: int, message_id: int, status: str) -> None:
    """Called on the event loop when an answer has been saved; returns at once."""
    if status != Message.Status.COMPLETE or not settings.TITLES_FROM_MODEL:
        return
    ensure_title_service()
    _keep(asyncio.get_running_loop().create_task(_enqueue(conversation_id, message_id)))


async def _enqueue(conversation_id: int, message_id: int) -> None:
    # Not thread-sensitive: an eager task generates here, and must not hold up the
    # process's shared thread for database calls meanwhile.
    try:
        await sync_to_async(_enqueue_sync, thread_sensitive=False)(conversation_id, message_id)
    except Exception:
        log.exception("the title task for conversation %s failed", conversation_id)


def _enqueue_sync(conversation_id: int, message_id: int) -> None:
    close_old_connections()
    try:
        if is_first_answer(message_id):
            enqueue_on_commit(GENERATE_TITLE, conversation_id)
    finally:
        connections.close_all()  # this pool thread's connections only
