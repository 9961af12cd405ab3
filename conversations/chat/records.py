"""The typed records of a live answer, and the interface the tool loop works through.

A live node of the message tree is one of two things, each its own type:

- :class:`Answer`: an assistant message the engine generates, token by token;
- :class:`ToolRun`: a ``tool`` node of the tool loop (``conversations.chat.tool_loop``): a
  call waiting for approval, running, then saved with its result.

Both share :class:`LiveNode`, what the manager, the relay and the fence need of any live
node. Where each stands in its lifecycle is a :class:`Phase`, moved only by
``conversations.chat.lifecycle``.

:class:`AnswerHost` is what the tool loop needs of the manager that runs these records (the
manager implements it), so that the tool loop depends on an interface rather than on the
manager, and the manager on the tool loop: no circle between them.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from conversations.chat.reasoning import Reasoning

if TYPE_CHECKING:
    from conversations.accounts.quota import QuotaGate
    from inference import AsyncEngine
    from inference.tools import ToolFormat


class Phase(enum.Enum):
    """Where a live node stands. ``queued`` -> ``streaming`` -> (``tool_step`` ->
    ``streaming``)* -> one of the four ends. The row's ``status`` is ``streaming`` in every
    phase before an end; the ends are ``complete`` (finished), ``interrupted``, ``error``,
    and for ``fenced`` whatever the process that took the row over wrote."""

    QUEUED = "queued"
    STREAMING = "streaming"
    TOOL_STEP = "tool_step"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"
    ERROR = "error"
    FENCED = "fenced"


ENDS = frozenset({Phase.FINISHED, Phase.INTERRUPTED, Phase.ERROR, Phase.FENCED})
# The moves allowed; an end may be reached from any phase before one (a stop, a crash, a
# fence can come at any time).
MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.QUEUED: frozenset({Phase.STREAMING, Phase.TOOL_STEP}) | ENDS,
    Phase.STREAMING: frozenset({Phase.TOOL_STEP}) | ENDS,
    Phase.TOOL_STEP: frozenset({Phase.STREAMING}) | ENDS,
}


class StopReason(enum.StrEnum):
    """Why a live node was stopped before its natural end."""

    USER = "user"
    GRACE = "grace"  # no tab showed the conversation for the grace period
    DELETED = "deleted"
    SHUTDOWN = "shutdown"
    FENCED = "fenced"  # its row is not this process's any more
    CANCELLED = "cancelled"


@dataclass(eq=False)
class LiveNode:
    """What every live node has: its identity, its task and grace timer, its text so far
    and how much of it was relayed to other processes."""

    message_id: int
    conversation_id: int
    owner_id: int  # the user
    request_id: str
    phase: Phase = Phase.QUEUED
    stop_reason: StopReason | str | None = None
    text: str = ""
    reasoning: Reasoning = field(default_factory=Reasoning)
    token_ids: list[int] = field(default_factory=list)
    task: asyncio.Task | None = None
    grace_handle: asyncio.TimerHandle | None = None
    relayed: int = 0  # characters of text sent to the group so far
    relayed_reasoning: int = 0  # ... of reasoning
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class AnswerTools:
    """An answer's tool format, and whether tools were offered to it (then its calls run)."""

    format: ToolFormat
    offered: bool


@dataclass(eq=False)
class Answer(LiveNode):
    """An assistant message being generated."""

    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    dropped: int = 0
    fingerprint: str = ""  # the tokenizer's, stored with the answer's ids
    # The prompt's ids where the next turn's prompt starts with them and then the answer's,
    # with its cache options: for KV retention.
    prompt_ids: list[int] | None = None
    cache_options: dict[str, object] = field(default_factory=dict)
    engine: AsyncEngine | None = None
    # The tool format and offer, set as the prompt is built; the calls it ended with.
    tools: AnswerTools | None = None
    tool_calls: list[dict] | None = None
    start_fields: dict[str, object] = field(default_factory=dict)  # the prompt's counts, the model
    # Its token budgets (conversations.accounts.quota): charged by the engine every step.
    quota_gate: QuotaGate | None = None


@dataclass
class ToolStep:
    """A ``tool`` node's work: its call, the calls after it, and its approval."""

    call: dict  # {"id", "name", "arguments"}
    remaining: list[dict]
    approval: bool  # wait for the user's decision first
    # Calls of this answer that may still run, this one included: past the cap
    # (``CHAT_TOOL_MAX_CALLS``) a call's result is an error saying so, and nothing runs.
    allowed: int = 1
    decision: asyncio.Future[bool] | None = None
    work: asyncio.Task | None = None


@dataclass(eq=False)
class ToolRun(LiveNode):
    """A ``tool`` node being worked on."""

    step: ToolStep = field(default_factory=lambda: ToolStep({}, [], False))


class Emitter(Protocol):
    def emit(self, conversation_id: int, event: dict) -> None:
        """Push an event, without blocking, to this process's tabs of the conversation."""


class AnswerHost(Emitter, Protocol):
    """What the tool loop needs of the manager that runs its nodes."""

    def start_answer(self, *, conversation_id: int, owner_id: int, message_id: int) -> Answer:
        """Generate the streaming answer row ``message_id`` here."""

    def start_tool_step(
        self, *, conversation_id: int, owner_id: int, message_id: int, step: ToolStep
    ) -> ToolRun:
        """Work on the streaming ``tool`` row ``message_id`` here."""

    def get(self, message_id: int) -> Answer | ToolRun | None:
        """The live node ``message_id`` of this process, if any."""

    def forget(self, node: LiveNode) -> None:
        """``node`` is done (its final save was made): no longer live here."""
