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
   The prompt is salted with the conversation's owner (``conversations.chat.cache_salt``):
   only the fixed instruction's blocks are shared between users, never the exchange.
3. The title is stored only while ``title_source`` is still ``auto`` (a title the user set
   stays theirs), then announced: ``conversations`` to the owner's tabs (the sidebar reloads)
   and ``title {conversation_id, title}`` to the tabs showing that conversation.

Under the embedded defaults (eager Celery, in-memory layer) the task's work runs inside the
site process as a coroutine on its event loop (:func:`awrite_title`), with that process's
engine: no worker thread waits on the loop, which a shutdown stops (it cancels the
coroutine instead, :func:`cancel_title_work`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
import weakref
from typing import TYPE_CHECKING

from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from conversations.chat.cache_salt import cache_options
from conversations.chat.groups import broadcast, conversation_group, user_group
from conversations.chat.tree import Tree
from conversations.enqueue import GENERATE_TITLE, enqueue_on_commit, tasks_run_here
from conversations.models import Conversation, Message
from conversations.ops import stopping
from conversations.ops.engine_handle import aget_engine, engine_status
from conversations.ops.served_models import title_model_id

if TYPE_CHECKING:
    from inference import AsyncEngine

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
        conversation__temporary=False,  # a temporary chat is never titled (nor kept)
    ).exists()


def first_exchange(conversation_id: int) -> tuple[str, str] | None:
    """The shown thread's first question and its complete answer, if the title is still the
    model's to write."""
    if not Conversation.objects.filter(
        pk=conversation_id, title_source=Conversation.TitleSource.AUTO, temporary=False
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


def save_title(conversation_id: int, title: str) -> int | None:
    """Store ``title`` unless the user set one meanwhile; the owner's id if it was stored
    (for :func:`announce_title`), else None. Synchronous."""
    updated = Conversation.objects.filter(
        pk=conversation_id, title_source=Conversation.TitleSource.AUTO
    ).update(title=title, title_source=Conversation.TitleSource.MODEL)
    if not updated:
        return None
    return Conversation.objects.filter(pk=conversation_id).values_list("owner_id", flat=True).first()


async def announce_title(conversation_id: int, owner_id: int, title: str) -> None:
    await broadcast(user_group(owner_id), "conversations")
    await broadcast(
        conversation_group(conversation_id), "title", conversation_id=conversation_id, title=title
    )


# --- Asking an engine ------------------------------------------------------------------


async def generate_with_engine(engine: AsyncEngine, messages: list[dict], owner_id: int) -> str:
    """Greedy, short: the same title for the same exchange. Salted with ``owner_id``, the
    conversation's owner, from the end of the instruction (every user's same system prompt)."""
    from inference import SamplingParams
    from inference.prompt import encode_segments

    encoding = await asyncio.to_thread(encode_segments, engine.tokenizer, messages)
    shared = len(encoding.segments[0]) if encoding.exact else 0
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TITLE_TOKENS)
    text = ""
    stream = engine.stream(
        encoding.token_ids,
        params,
        request_id=f"title-{uuid.uuid4().hex[:12]}",
        **cache_options(owner_id, shared),
    )
    try:
        async for delta in stream:
            text += delta.text
            if delta.finished:
                break
    finally:
        await stream.aclose()
    return text


async def ask_site(messages: list[dict], owner_id: int, timeout: float) -> str:
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
            "owner_id": owner_id,
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


async def _title_text(messages: list[dict], owner_id: int, local_only: bool) -> str:
    if engine_status()["ready"]:  # this process is a site process with its engine loaded
        return await generate_with_engine(await aget_engine(title_model_id()), messages, owner_id)
    if local_only:
        raise NoLiveEngine("this process has no engine loaded")
    return await ask_site(messages, owner_id, settings.TITLE_REPLY_SECONDS)


def _exchange_and_owner(conversation_id: int) -> tuple[tuple[str, str], int] | None:
    """The first exchange to title and the conversation's owner, whose namespace salts the
    title prompt; None when there is nothing to title."""
    exchange = first_exchange(conversation_id)
    owner_id = Conversation.all_objects.filter(pk=conversation_id).values_list("owner_id", flat=True).first()
    return None if exchange is None or owner_id is None else (exchange, owner_id)


async def awrite_title(conversation_id: int, local_only: bool = False) -> str | None:
    """The task's work: the title written and announced, or None when there is nothing to do
    (the user set a title, the conversation is gone, the model wrote nothing usable).
    Raises :class:`NoLiveEngine` when no engine could be asked."""
    found = await database_sync_to_async(_exchange_and_owner)(conversation_id)
    if found is None:
        return None
    exchange, owner_id = found
    title = _usable(conversation_id, await _title_text(title_messages(*exchange), owner_id, local_only))
    saved_for = await database_sync_to_async(save_title)(conversation_id, title) if title else None
    if saved_for is None:
        return None
    await announce_title(conversation_id, saved_for, title)
    return title


def write_title(conversation_id: int, local_only: bool = False) -> str | None:
    """:func:`awrite_title` for a Celery worker's thread. Its coroutines run on an event loop
    of their own, never handed to a site process's loop (as ``async_to_sync`` does from one of
    that loop's worker threads): that loop may stop for good before it runs them."""
    found = _exchange_and_owner(conversation_id)
    if found is None:
        return None
    exchange, owner_id = found
    text = async_to_sync(_title_text, force_new_loop=True)(title_messages(*exchange), owner_id, local_only)
    title = _usable(conversation_id, text)
    saved_for = save_title(conversation_id, title) if title else None
    if saved_for is None:
        return None
    async_to_sync(announce_title, force_new_loop=True)(conversation_id, saved_for, title)
    return title


def _usable(conversation_id: int, text: str) -> str:
    title = clean_title(text)
    if not title:
        log.info("the model wrote no usable title for conversation %s", conversation_id)
    return title


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
    owner_id = request.get("owner_id")
    if not isinstance(reply_channel, str) or not isinstance(messages, list):
        return
    if float(request.get("deadline") or 0) < time.time():
        return  # the worker gave up on it
    try:
        if not isinstance(owner_id, int):
            # No owner, no title: an unsalted prompt would put the question in everyone's cache.
            raise ValueError("a title request must name the conversation's owner")
        text = await generate_with_engine(await aget_engine(title_model_id()), messages, owner_id)
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
    if status != Message.Status.COMPLETE or not settings.TITLES_FROM_MODEL or stopping.is_stopping():
        return
    ensure_title_service()
    _keep(asyncio.get_running_loop().create_task(_title_job(conversation_id, message_id)))


async def _title_job(conversation_id: int, message_id: int) -> None:
    try:
        if not await database_sync_to_async(is_first_answer)(message_id):
            return
        if tasks_run_here():
            # Eager Celery would run the task right here, in a worker thread waiting on this
            # loop; the same work as a task of the loop can be cancelled at shutdown.
            await awrite_title(conversation_id, local_only=True)
        else:
            # Off the shared thread that serves the sync views: a broker that is slow to
            # answer holds up only this.
            await sync_to_async(enqueue_on_commit, thread_sensitive=False)(GENERATE_TITLE, conversation_id)
    except NoLiveEngine as exc:
        log.info("no title for conversation %s: %s", conversation_id, exc)
    except Exception:
        log.exception("the title task for conversation %s failed", conversation_id)


async def cancel_title_work(timeout: float) -> int:
    """At shutdown: cancel this loop's title jobs and its title service, and wait for them
    at most ``timeout`` seconds. Returns how many jobs were cut short."""
    loop = asyncio.get_running_loop()
    jobs = [task for task in _pending if task.get_loop() is loop and not task.done()]
    service = _services.pop(loop, None)
    tasks = jobs + ([service] if service is not None and not service.done() else [])
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    return len(jobs)
