"""The chat websocket: one socket per browser tab, a signed-in user's, at ``/ws/chat/`` or
``/ws/chat/<id>/`` (which opens that conversation at once); the protocol, its error codes
and close codes are in docs/interfaces.md ("The websocket protocol").

The consumer parses each request, calls the chat service (``conversations.chat.service``:
where an answer runs is its business) and pushes what comes back; what the tab is shown is
its ``TabView``'s (``conversations.chat.tab_view``). Answers never run inside a receive
handler, so a disconnect is handled at once and the answer goes on without the socket.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from channels.db import database_sync_to_async
from django.db import DatabaseError

from conversations.chat import service
from conversations.chat import tree as tree_ops
from conversations.chat.groups import broadcast, conversation_group, user_group
from conversations.chat.queries import NotFound, get_conversation
from conversations.chat.retention import get_retention
from conversations.chat.socket_base import JsonSocketConsumer, Outbox
from conversations.chat.tab_view import TabView
from conversations.models import Conversation

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
MAX_MESSAGE_CHARS = 100_000


class ChatConsumer(JsonSocketConsumer):
    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.view = TabView(self)
        self.outbox = Outbox()
        self.sender: asyncio.Task | None = None
        self.write_now: Callable[[dict], None] | None = None  # set once accepted (Daphne only)
        self.groups_joined: list[str] = []
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        initial = self.scope.get("url_route", {}).get("kwargs", {}).get("conversation_id")
        conversation = None
        if initial is not None:
            try:
                conversation = await get_conversation(self.user, initial)
            except NotFound:
                await self.close(code=CLOSE_NOT_FOUND)
                return
        await self.accept()
        self.sender = asyncio.create_task(self._send_loop())
        self.write_now = self.write_frame
        await self._join(user_group(self.user.pk))
        if conversation is not None:
            await self._open(conversation)

    @property
    def conversation(self) -> Conversation | None:
        view = getattr(self, "view", None)
        return view.conversation if view is not None else None

    async def disconnect(self, code) -> None:
        if self.conversation is not None:
            await self._unwatch(self.conversation.pk)
            get_retention().switch(self.conversation.pk, None)
            self.view.conversation = None
        await self._leave_all()
        self.write_now = None
        # Let go of the task as it is cancelled: it keeps its CancelledError, whose traceback
        # holds this consumer, so a consumer still holding the task would be a reference cycle
        # (the connection's every object, freed only by a full garbage collection).
        sender, self.sender = getattr(self, "sender", None), None
        if sender is not None:
            sender.cancel()

    # Outgoing ------------------------------------------------------------------------
    def push(self, event: dict) -> None:
        """Called by the generation manager (and by this consumer) without awaiting."""
        self.deliver(event)
        if event["type"] == "finished":  # the retention's only interest
            get_retention().on_event(getattr(self.conversation, "pk", None), event)

    def error(self, detail: str, code: str = "invalid", **extra) -> None:
        self.push({"type": "error", "detail": detail, "code": code, **extra})

    # Incoming ------------------------------------------------------------------------
    async def receive_json(self, content, **kwargs) -> None:
        if not isinstance(content, dict):
            return
        handler = (
            getattr(self, f"_on_{content.get('type')}", None) if content.get("type") in REQUESTS else None
        )
        if handler is None:
            self.error(f"unknown request {content.get('type')!r}")
            return
        try:
            await handler(content)
        except NotFound:
            await self.close(code=CLOSE_NOT_FOUND)
        except tree_ops.TreeError as exc:
            extra = {"message_id": content["message_id"]} if "message_id" in content else {}
            self.error(str(exc), exc.code, **extra)
        except DatabaseError:
            log.exception("database error in %s", content.get("type"))
            self.error("The database could not complete this request; please try again.", "server_error")
        except Exception:
            log.exception("request %s failed", content.get("type"))
            self.error("The server could not complete this request.", "server_error")

    async def _conversation_for(self, content: dict) -> Conversation:
        """The conversation a request names (it must be the user's); opens it if it isn't open."""
        conversation_id = content.get("conversation_id")
        if conversation_id is None and self.conversation is not None:
            return self.conversation
        if conversation_id is None:
            raise tree_ops.NotInConversation("no conversation is open")
        conversation = await get_conversation(self.user, conversation_id)
        if self.conversation is None or self.conversation.pk != conversation.pk:
            await self._open(conversation, send_thread=False)
        return self.conversation

    async def _open(self, conversation: Conversation, send_thread: bool = True) -> None:
        if self.conversation is not None and self.conversation.pk != conversation.pk:
            await self._unwatch(self.conversation.pk)
            await self._leave(conversation_group(self.conversation.pk))
        # An empty thread has no history to keep warm (its first answer marks it): with the
        # thread read here, the mark waits for it.
        retention = get_retention()
        first = retention.switch(
            getattr(self.conversation, "pk", None), conversation.pk, mark=not send_thread
        )
        self.view.conversation = conversation
        await service.watch(conversation.pk, self)
        await self._join(conversation_group(conversation.pk))
        if send_thread:
            thread = await self.view.send_thread(fresh=True)
            if first and (thread is None or thread["messages"]):
                retention.mark_soon(conversation.pk)

    async def _unwatch(self, conversation_id: int) -> None:
        self.view.forget_relayed()
        await service.unwatch(conversation_id, self)

    async def _tree_changed(self) -> None:
        await self.view.send_thread()
        await broadcast(conversation_group(self.conversation.pk), "tree", origin=self.channel_name)

    async def _on_open(self, content: dict) -> None:
        await self._open(await get_conversation(self.user, content.get("conversation_id")))

    async def _on_ping(self, content: dict) -> None:
        self.push({"type": "pong"})

    def _text(self, content: dict) -> str:
        text = str(content.get("content") or "")
        if len(text) > MAX_MESSAGE_CHARS:
            raise tree_ops.TreeError(f"the message is longer than {MAX_MESSAGE_CHARS} characters")
        return text

    async def _on_send(self, content: dict) -> None:
        text = self._text(content)
        await self._conversation_for(content)
        models = content.get("models")
        if isinstance(models, list) and len(models) > 1:
            models = [str(m) for m in models]
            await service.send_side_by_side(self.view, self.user.pk, text, content.get("parent_id"), models)
        else:
            await service.start_answer(
                self.view,
                self.user.pk,
                tree_ops.send_message,
                text,
                content.get("parent_id"),
                model=_model(content),
            )
        # A new title, or the conversation moved to the top of the sidebar.
        await broadcast(user_group(self.user.pk), "conversations")

    async def _on_edit(self, content: dict) -> None:
        await self._conversation_for(content)
        text = self._text(content)
        await service.start_answer(
            self.view, self.user.pk, tree_ops.edit_message, content.get("message_id"), text
        )

    async def _on_regenerate(self, content: dict) -> None:
        await self._conversation_for(content)
        await service.regenerate(self.view, self.user.pk, content.get("message_id"), _model(content))

    async def _on_set_model(self, content: dict) -> None:
        conversation = await self._conversation_for(content)
        await service.choose_model(conversation, self.user, str(content.get("model") or ""))
        await self._tree_changed()

    async def _on_switch(self, content: dict) -> None:
        conversation = await self._conversation_for(content)
        await database_sync_to_async(tree_ops.switch_branch)(conversation, content.get("message_id"))
        await self._tree_changed()

    async def _on_keep(self, content: dict) -> None:
        conversation = await self._conversation_for(content)
        await service.keep_answer(conversation, content.get("message_id"))
        await self._tree_changed()

    async def _on_delete(self, content: dict) -> None:
        await service.delete_subtree(await self._conversation_for(content), content.get("message_id"))
        await self._tree_changed()

    async def _on_earlier(self, content: dict) -> None:
        """``earlier {before_id}``: the page of the thread before a message this tab shows."""
        await self._conversation_for(content)
        await self.view.send_earlier(content.get("before_id"))

    async def _on_fork(self, content: dict) -> None:
        """``fork {message_id}``: the path to it as a new conversation (conversations.chat.fork)."""
        from conversations.chat.fork import fork_at

        conversation = await database_sync_to_async(fork_at)(self.user, content.get("message_id"))
        self.push({"type": "forked", "conversation_id": conversation.pk})
        await broadcast(user_group(self.user.pk), "conversations")

    async def _on_approve(self, content: dict) -> None:
        conversation = await self._conversation_for(content)
        await service.approve(conversation, content.get("message_id"), content.get("approved"))

    async def _on_stop(self, content: dict) -> None:
        await service.stop_answer(await self._conversation_for(content), content.get("message_id"))

    # Events from the channel layer ---------------------------------------------------
    async def chat_event(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "conversations":
            self.push({"type": "conversations"})
            return
        if self.conversation is None:
            return
        cid = self.conversation.pk
        if kind == "title" and event.get("conversation_id") == cid:
            self.push({"type": "title", "conversation_id": cid, "title": event.get("title", "")})
        elif kind == "deleted" and event.get("conversation_id") == cid:
            get_retention().switch(cid, None)
            service.conversation_deleted(cid)
            await self._unwatch(cid)
            await self._leave(conversation_group(cid))
            self.push({"type": "deleted", "conversation_id": cid})
            self.view.conversation = None
        elif kind == "stop":
            service.stop_here(cid, event.get("message_id"))
        elif (kind == "tree" and event.get("origin") != self.channel_name) or kind == "settings":
            await self.view.send_thread()
        elif kind != "tree":
            await self.view.group_event(kind, event)


# The requests a tab may make (``receive_json`` calls ``_on_<type>``).
REQUESTS = frozenset(
    {
        "open",
        "send",
        "stop",
        "edit",
        "regenerate",
        "switch",
        "keep",
        "delete",
        "ping",
        "fork",
        "approve",
        "earlier",
        "set_model",
    }
)


def _model(content: dict) -> str | None:
    """A request's ``model`` (a model id), if it names one."""
    model = content.get("model")
    return str(model) if model else None
