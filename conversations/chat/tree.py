"""Walking and changing a conversation's message tree.

A conversation's messages are loaded in one query (without their token ids), so any
walk over them (the visible thread, the siblings of each message, a subtree) costs a
bounded number of queries however long the conversation is.

Selection is remembered at every level: ``Message.active_child`` is the child last
selected under a message and ``Conversation.active_root`` the root, so descending
through them from any message reaches the leaf last shown in that branch. Every
operation that changes what is shown goes through :func:`select_leaf`, which keeps
those pointers consistent with ``Conversation.current_leaf``.

Every change runs in one transaction that first takes the row locks of
``conversations.chat.answer_locks`` (the conversation's; for an edit that starts an answer,
the user's too, with the site-wide limits on live answers checked under them).

All functions here are synchronous (call them through ``database_sync_to_async``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

# The row locks and the live-answer limits, importable from here where callers look for them.
from conversations.chat.answer_locks import (  # noqa: F401
    LEGACY_STALE_SECONDS,
    live_answer_conversations,
    lock_conversation,
    lock_for_answer,
)
from conversations.chat.lifecycle import queued_fields

# What the browser receives, importable from here where callers look for it.
from conversations.chat.thread_dicts import (  # noqa: F401
    conversation_dict,
    message_dict,
    thread_dict,
    tool_dict,
)

# The operations' errors, importable from here where callers look for them.
from conversations.chat.tree_errors import (  # noqa: F401
    Busy,
    NotAllowed,
    NotInConversation,
    QuotaExhausted,
    TemporaryChat,
    TreeError,
)
from conversations.models import Conversation, Message
from conversations.models.chat import DEFAULT_TITLE
from conversations.prepared_queries import PreparedInsert, PreparedRead, PreparedUpdate

TITLE_LENGTH = 60

# The statements of every answer's creation, their SQL built once (``conversations.prepared_queries``).
_messages_of = PreparedRead(
    lambda conversation_id: (
        Message.objects.filter(conversation_id=conversation_id)
        .defer("token_ids")
        .order_by("created_at", "id")
    )
)
_conversation_row = PreparedUpdate(lambda pk: Conversation.objects.filter(pk=pk))
_insert_message = PreparedInsert(Message)


@dataclass
class Tree:
    conversation: Conversation
    by_id: dict[int, Message] = field(default_factory=dict)
    # parent id (None for the roots) -> children, oldest first
    children: dict[int | None, list[Message]] = field(default_factory=lambda: defaultdict(list))
    # Ids of the messages written since the load (``add``): every field of theirs is in hand.
    written: set[int] = field(default_factory=set)

    @classmethod
    def load(cls, conversation: Conversation) -> Tree:
        """All of ``conversation``'s messages in one query (token ids deferred)."""
        tree = cls(conversation)
        for message in _messages_of(conversation.pk):
            tree.by_id[message.pk] = message
            tree.children[message.parent_id].append(message)
        return tree

    def get(self, message_id: int | None) -> Message:
        try:
            return self.by_id[int(message_id)]  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            raise NotInConversation(f"no message {message_id!r} in this conversation") from None

    def roots(self) -> list[Message]:
        return self.children.get(None, [])

    def siblings(self, message: Message) -> list[Message]:
        """``message`` and the messages that share its parent, oldest first."""
        return self.children.get(message.parent_id, [])

    def side_by_side(self, question: Message) -> list[Message]:
        """The answers under ``question`` that one side-by-side send started together, oldest
        first, while the user has not settled on one: not kept, and not gone on from (a
        question under one of them). Fewer than two such answers is no group: []."""
        if question.role != Message.Role.USER or question.side_by_side_kept:
            return []
        group = [m for m in self.children.get(question.pk, ()) if m.side_by_side]
        if len(group) < 2 or any(
            child.role == Message.Role.USER for m in group for child in self.children.get(m.pk, ())
        ):
            return []
        return group

    def path_to(self, message: Message) -> list[Message]:
        """The messages from the root down to ``message``."""
        path = []
        node: Message | None = message
        while node is not None:
            path.append(node)
            node = self.by_id.get(node.parent_id) if node.parent_id is not None else None
        path.reverse()
        return path

    def descend(self, message: Message) -> Message:
        """The leaf last selected below ``message`` (following ``active_child``)."""
        node = message
        seen = set()
        while kids := self.children.get(node.pk):
            seen.add(node.pk)
            chosen = self.by_id.get(node.active_child_id) if node.active_child_id else None
            if chosen is None or chosen.parent_id != node.pk or chosen.pk in seen:
                chosen = kids[-1]
            node = chosen
        return node

    def default_root(self) -> Message | None:
        roots = self.roots()
        if not roots:
            return None
        chosen = (
            self.by_id.get(self.conversation.active_root_id) if self.conversation.active_root_id else None
        )
        return chosen if chosen is not None and chosen.parent_id is None else roots[-1]

    def leaf(self) -> Message | None:
        leaf = (
            self.by_id.get(self.conversation.current_leaf_id) if self.conversation.current_leaf_id else None
        )
        if leaf is not None:
            return leaf
        root = self.default_root()
        return self.descend(root) if root is not None else None

    def thread(self) -> list[Message]:
        """The visible thread: the path from a root to the current leaf."""
        leaf = self.leaf()
        return self.path_to(leaf) if leaf is not None else []

    def subtree_ids(self, message: Message) -> list[int]:
        ids, stack = [], [message]
        while stack:
            node = stack.pop()
            ids.append(node.pk)
            stack.extend(self.children.get(node.pk, []))
        return ids

    def add(self, message: Message) -> None:
        """A message just written (created with all its fields)."""
        self.written.add(message.pk)
        self.by_id[message.pk] = message
        self.children[message.parent_id].append(message)


def path_rows(conversation_id: int, leaf_id: int | None, *fields) -> list[tuple]:
    """The path from the root down to ``leaf_id`` as ``(id, *fields)`` tuples (``fields``:
    names or expressions for ``values_list``). One query over light columns, no model
    instances and no texts, so even a long conversation's path is read in milliseconds."""
    if leaf_id is None:
        return []
    rows = {
        row[0]: row
        for row in Message.objects.filter(conversation_id=conversation_id).values_list(
            "id", "parent_id", *fields
        )
    }
    path: list[tuple] = []
    node = rows.get(leaf_id)
    while node is not None and len(path) <= len(rows):  # bounded even by a (corrupt) cycle
        path.append((node[0], *node[2:]))
        node = rows.get(node[1]) if node[1] is not None else None
    path.reverse()
    return path


def select_leaf(tree: Tree, leaf: Message | None, **also) -> None:
    """Show the thread ending at ``leaf``: point every ancestor's ``active_child`` along it.
    ``also``: other fields of the conversation to set in the same update."""
    conversation = tree.conversation
    changed = []
    if leaf is not None:
        path = tree.path_to(leaf)
        for parent, child in zip(path, path[1:], strict=False):
            # No pointer under a parent of one child means that child (``descend``), so a
            # new message's first answer costs no update; a second child sets it.
            implied = parent.active_child_id is None and len(tree.children.get(parent.pk, ())) == 1
            if parent.active_child_id != child.pk and not implied:
                parent.active_child_id = child.pk
                changed.append(parent)
        root_id = path[0].pk
    else:
        root = tree.default_root()
        root_id = root.pk if root is not None else None
    if changed:
        Message.objects.bulk_update(changed, ["active_child"])
    conversation.current_leaf_id = leaf.pk if leaf is not None else None
    conversation.active_root_id = root_id
    for name, value in also.items():
        setattr(conversation, name, value)
    _conversation_row(
        conversation.pk, current_leaf_id=conversation.current_leaf_id, active_root_id=root_id, **also
    )


def _touch(conversation: Conversation) -> None:
    conversation.updated_at = timezone.now()
    _conversation_row(conversation.pk, updated_at=conversation.updated_at)


def make_title(text: str) -> str:
    """A sidebar title from a first message: its first line, without Markdown marks."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = re.sub(r"[`*_#>\[\]]+", "", line)
    line = re.sub(r"\s+", " ", line).strip()
    if not line:
        return DEFAULT_TITLE
    if len(line) <= TITLE_LENGTH:
        return line
    cut = line[:TITLE_LENGTH].rsplit(" ", 1)[0] or line[:TITLE_LENGTH]
    return cut.rstrip(" ,.;:") + "…"


def _new_message(tree: Tree, parent: Message | None, role: str, content: str = "", **fields) -> Message:
    message = _insert_message(
        conversation=tree.conversation,
        parent=parent,
        role=role,
        content=content,
        **fields,
    )
    tree.add(message)
    return message


def _new_answer(
    tree: Tree, parent: Message, owner_process: str, model: str = "", side_by_side: bool = False
) -> Message:
    """An empty answer asked of ``model`` (a model id; ``conversations.chat.model_choice``);
    ``side_by_side``: one of the answers a side-by-side send starts together."""
    return _new_message(
        tree,
        parent,
        Message.Role.ASSISTANT,
        model_name=model[:200],
        side_by_side=side_by_side,
        **queued_fields(owner_process),
    )


@transaction.atomic
def send_message(
    conversation: Conversation,
    content: str,
    parent_id: int | None = None,
    *,
    owner_process: str = "",
    live_processes: set[str] | None = None,
    model: str = "",
    side_by_side: bool = False,
) -> tuple[Tree, Message]:
    """Add a user message under the current leaf (or ``parent_id``, an answer in this
    conversation) and an empty answer under it, generated by ``owner_process``
    (``side_by_side``: the first of a side-by-side send's answers; ``regenerate`` adds the others).

    Returns the tree and the new answer (status streaming), which is now the current leaf.
    Raises ``Busy`` when a live answer limit would be exceeded (nothing is saved then)."""
    content = content.strip()
    if not content:
        raise TreeError("the message is empty")
    lock_for_answer(conversation, live_processes)
    tree = Tree.load(conversation)
    parent = tree.get(parent_id) if parent_id is not None else tree.leaf()
    # A tool result ends the thread when its loop was stopped: the user may go on from it.
    if parent_id is not None and parent.role not in (Message.Role.ASSISTANT, Message.Role.TOOL):
        raise TreeError("a new message can only follow an answer")
    user = _new_message(tree, parent, Message.Role.USER, content)
    answer = _new_answer(tree, user, owner_process, model, side_by_side)
    also = {"updated_at": timezone.now()}  # touched: the top of the sidebar
    if conversation.title == DEFAULT_TITLE and parent is None:
        also["title"] = make_title(content)
    select_leaf(tree, answer, **also)
    return tree, answer


@transaction.atomic
def edit_message(
    conversation: Conversation,
    message_id: int,
    content: str,
    *,
    owner_process: str = "",
    live_processes: set[str] | None = None,
    model: str = "",
) -> tuple[Tree, Message]:
    """A sibling of user message ``message_id`` with ``content``, and a fresh answer under it.

    The old message and its branch stay; the new branch is selected."""
    content = content.strip()
    if not content:
        raise TreeError("the message is empty")
    lock_for_answer(conversation, live_processes)
    tree = Tree.load(conversation)
    original = tree.get(message_id)
    if original.role != Message.Role.USER:
        raise TreeError("only your own messages can be edited")
    parent = tree.by_id.get(original.parent_id) if original.parent_id else None
    user = _new_message(tree, parent, Message.Role.USER, content)
    answer = _new_answer(tree, user, owner_process, model)
    select_leaf(tree, answer, updated_at=timezone.now())
    return tree, answer


@transaction.atomic
def regenerate(
    conversation: Conversation,
    message_id: int,
    *,
    owner_process: str = "",
    live_processes: set[str] | None = None,
    model: str = "",
    beside_live: bool = False,
) -> tuple[Tree, Message]:
    """A new answer: a sibling of assistant message ``message_id``, or a child of user message
    ``message_id`` (a question left without an answer). ``beside_live``: one of a question's
    side-by-side answers, started while its siblings are being written; the thread keeps
    showing the first of them (a question sent next goes on from it)."""
    lock_for_answer(conversation, live_processes, beside_live)
    tree = Tree.load(conversation)
    message = tree.get(message_id)
    if message.role == Message.Role.ASSISTANT:
        parent = tree.by_id.get(message.parent_id) if message.parent_id else None
        if parent is None:
            raise TreeError("this answer has no question to answer again")
    elif message.role == Message.Role.USER:
        parent = message
    else:
        raise TreeError("system messages cannot be regenerated")
    answer = _new_answer(tree, parent, owner_process, model, side_by_side=beside_live)
    select_leaf(tree, tree.leaf() if beside_live else answer, updated_at=timezone.now())
    return tree, answer


@transaction.atomic
def keep_answer(conversation: Conversation, message_id: int) -> tuple[Tree, list[int]]:
    """The user keeps one of a question's side-by-side answers: its branch is shown, and the
    group is one answer with sibling branches from now on. Returns the tree and the group's
    other answers still being written (the caller stops them: the user chose)."""
    lock_conversation(conversation)
    tree = Tree.load(conversation)
    answer = tree.get(message_id)
    question = tree.by_id.get(answer.parent_id) if answer.parent_id else None
    group = tree.side_by_side(question) if question is not None else []
    if answer not in group:
        raise TreeError("this answer is not one of a side-by-side choice")
    question.side_by_side_kept = True
    Message.objects.filter(pk=question.pk).update(side_by_side_kept=True)
    select_leaf(tree, tree.descend(answer))
    return tree, [m.pk for m in group if m is not answer and m.status == Message.Status.STREAMING]


@transaction.atomic
def switch_branch(conversation: Conversation, message_id: int) -> Tree:
    """Show the branch through ``message_id``, down to the leaf last selected in it."""
    lock_conversation(conversation)
    tree = Tree.load(conversation)
    message = tree.get(message_id)
    select_leaf(tree, tree.descend(message))
    return tree


@transaction.atomic
def select_message(conversation: Conversation, message_id: int) -> Tree:
    """Make ``message_id`` itself the current leaf."""
    lock_conversation(conversation)
    tree = Tree.load(conversation)
    select_leaf(tree, tree.get(message_id))
    return tree


@transaction.atomic
def delete_subtree(conversation: Conversation, message_id: int) -> tuple[Tree, list[int]]:
    """Delete ``message_id`` and everything below it. If the thread showed it, show the
    nearest remaining sibling's branch instead (or stop at the parent).

    Returns the updated tree and the deleted ids."""
    lock_conversation(conversation)
    tree = Tree.load(conversation)
    message = tree.get(message_id)
    doomed = tree.subtree_ids(message)
    doomed_set = set(doomed)
    current = tree.leaf()
    siblings = tree.siblings(message)
    position = siblings.index(message)
    remaining = [m for m in siblings if m.pk != message.pk]
    parent = tree.by_id.get(message.parent_id) if message.parent_id else None

    Message.objects.filter(pk__in=doomed).delete()
    for pk in doomed:
        gone = tree.by_id.pop(pk)
        tree.children.pop(pk, None)
        tree.children[gone.parent_id] = [m for m in tree.children.get(gone.parent_id, []) if m.pk != pk]
    for node in tree.by_id.values():
        if node.active_child_id in doomed_set:
            node.active_child_id = None
    if conversation.active_root_id in doomed_set:
        conversation.active_root_id = None

    if current is None or current.pk in doomed_set:
        if remaining:
            neighbour = remaining[max(position - 1, 0)]
            new_leaf = tree.descend(neighbour)
        else:
            new_leaf = parent
        conversation.current_leaf_id = None
        select_leaf(tree, new_leaf)
    _touch(conversation)
    return tree, doomed


def ensure_empty_conversation(owner) -> Conversation:
    """The owner's untouched new chat if one exists (so "New chat" does not pile up empty
    conversations), else a fresh one."""
    empty = (
        Conversation.objects.filter(
            owner=owner, title=DEFAULT_TITLE, messages__isnull=True, temporary=False, archived_at__isnull=True
        )
        .order_by("-updated_at")
        .first()
    )
    if empty is not None:
        _touch(empty)
        return empty
    return Conversation.objects.create(owner=owner)


@transaction.atomic
def add_tool_step(
    conversation_id: int, parent_id: int, role: str, owner_process: str, **fields
) -> Message | None:
    """The next node of an answer's tool loop (a ``tool`` result or the answer that goes on),
    streaming, under ``parent_id``, which must be complete and still the thread's leaf: if
    the user moved on (sent, edited, switched) meanwhile, the loop ends (None)."""
    conversation = Conversation.objects.select_for_update().filter(pk=conversation_id).first()
    if conversation is None or conversation.current_leaf_id != parent_id:
        return None
    tree = Tree.load(conversation)
    parent = tree.by_id.get(parent_id)
    if parent is None or parent.status != Message.Status.COMPLETE:
        return None
    message = _new_message(tree, parent, role, **queued_fields(owner_process), **fields)
    select_leaf(tree, message)
    _touch(conversation)
    return message
