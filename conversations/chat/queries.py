"""The websocket consumer's reads and writes of the database, each one call off the event
loop (``conversations.ops.db_thread.db_call``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from conversations.accounts import quota
from conversations.accounts.access import access_for
from conversations.chat import lifecycle
from conversations.chat import tree as tree_ops
from conversations.chat.prompt_history import AnswerInputs, answer_inputs_from_tree
from conversations.chat.thread_dicts import every_message, thread_page
from conversations.cluster import registry as cluster
from conversations.models import Conversation, Message
from conversations.ops.db_thread import db_call
from conversations.ops.engine_handle import current_engine
from conversations.prepared_queries import PreparedRead

if TYPE_CHECKING:
    from inference import AsyncEngine


class NotFound(Exception):
    pass


_users_conversation = PreparedRead(
    lambda pk, owner_id: Conversation.objects.filter(pk=pk, owner_id=owner_id).order_by()[:1]
)


@db_call
def get_conversation(user, conversation_id) -> Conversation:
    try:
        found = _users_conversation(int(conversation_id), user.pk)
    except (TypeError, ValueError):
        raise NotFound from None
    if not found:
        raise NotFound
    return found[0]


@dataclass
class LoadedThread:
    tree: tree_ops.Tree
    thread: dict  # the visible thread, as the tabs get it
    # Orphans (``lifecycle.orphaned``) the thread shows as interrupted: for the caller to
    # settle (``lifecycle.settle_orphans``), since a read writes nothing.
    orphans: list[int]


@db_call
def load_thread(
    conversation: Conversation, live_ids: set[int], liveness: cluster.Liveness, refresh: bool = True
) -> LoadedThread:
    """The tree and the visible thread, orphans shown as interrupted; ``refresh``: read the
    conversation's row again first (False where the caller has just read it)."""
    if refresh:
        conversation.refresh_from_db()
    tree = tree_ops.Tree.load(conversation)
    orphans = lifecycle.orphaned(tree.by_id.values(), live_ids, liveness)
    thread = tree_ops.thread_dict(tree, paged=True)
    lifecycle.show_interrupted(list(every_message(thread["messages"])), orphans)
    return LoadedThread(tree, thread, orphans)


@db_call
def load_earlier(conversation: Conversation, before_id) -> dict:
    """The page of the thread just before ``before_id`` (a message of the visible branch the
    tab shows): ``{before_id, messages, earlier}`` as ``thread_page`` makes them."""
    tree = tree_ops.Tree.load(conversation)
    try:
        message = tree.by_id[int(before_id)]
    except (KeyError, TypeError, ValueError):
        raise tree_ops.NotInConversation(f"no message {before_id!r} in this conversation") from None
    messages, earlier = thread_page(tree.path_to(message)[:-1], tree)
    return {"before_id": message.pk, "messages": messages, "earlier": earlier}


@dataclass
class CreatedAnswer:
    answer: Message
    tree: tree_ops.Tree
    thread: dict  # as ``load_thread`` reads it
    inputs: AnswerInputs | None  # its prompt's first read, where it is generated here


@db_call
def create_answer(
    operation,
    conversation: Conversation,
    *args,
    live_ids: set[int],
    liveness: cluster.Liveness,
    engine: AsyncEngine | None = None,
    **kwargs,
) -> CreatedAnswer:
    """Run a tree operation that adds an answer (``send_message``, ``edit_message``,
    ``regenerate``): its answer and the thread after it, from the tree the operation loaded
    and changed under its locks (no second read); with ``engine`` (the loaded engine that
    generates it), also the first read of its prompt, in this same call."""
    check_model_access(conversation.owner_id, engine or current_engine())
    check_quota(conversation.owner_id)
    tree, answer = operation(conversation, *args, **kwargs)
    lifecycle.interrupt_orphans(list(tree.by_id.values()), live_ids, liveness)
    thread = tree_ops.thread_dict(tree, paged=True)
    inputs = answer_inputs_from_tree(tree, answer.pk, engine) if engine is not None else None
    return CreatedAnswer(answer, tree, thread, inputs)


def check_model_access(user_id: int, engine: AsyncEngine | None) -> None:
    """``NotAllowed`` when the user's groups exclude the served model (unknown until an
    engine is loaded in this process; every process of a site serves the same model)."""
    if engine is None:
        return
    access = access_for(user_id)
    if not access.may_use_model(engine.model_name):
        raise tree_ops.NotAllowed(f"Your groups do not give you access to the model {engine.model_name}.")


def check_quota(user_id: int) -> None:
    """``QuotaExhausted`` (saying what ran out and when it resets) before anything is created;
    the prompt is counted when the answer starts (``conversations.chat.answers``)."""
    try:
        quota.admission(user_id, 0)
    except quota.Exhausted as exc:
        raise tree_ops.QuotaExhausted(str(exc)) from exc


@db_call
def message_in(conversation: Conversation, message_id) -> Message:
    """The message ``message_id`` of ``conversation``, or NotInConversation."""
    try:
        return Message.objects.defer("token_ids").get(pk=int(message_id), conversation=conversation)
    except (Message.DoesNotExist, TypeError, ValueError):
        raise tree_ops.NotInConversation(f"no message {message_id!r} in this conversation") from None


@db_call
def streaming_owners(conversation_id: int) -> dict[int, str]:
    return dict(
        Message.objects.filter(conversation_id=conversation_id, status=Message.Status.STREAMING).values_list(
            "pk", "owner_process"
        )
    )
