"""What the prompt encoder takes and gives: a tokenizer with a chat template, and each
message's ids apart."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# A chat message: ``role`` and ``content``, and optionally ``token_ids`` (see ``encode_segments``)
# and the native fields below.
Message = Mapping[str, Any]
# OpenAI-shaped tools (``{"type": "function", "function": {...}}``), for the template's ``tools``.
Tools = Sequence[Mapping[str, Any]]
# Message fields the template gets besides role and content, as transformers passes them:
# an assistant's ``tool_calls`` (arguments as objects) and ``thinking`` (its reasoning), a tool
# result's ``tool_call_id`` and ``name``.
NATIVE_FIELDS = ("tool_calls", "thinking", "tool_call_id", "name")


class ChatTokenizer(Protocol):
    """The part of ``inference.tokenizer.Tokenizer`` the encoder uses (a protocol, so the
    tokenizer module can hand itself to the encoder without an import circle)."""

    eos_token_ids: list[int]

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, tools: Tools | None = None
    ) -> str: ...

    def token_text(self, token_id: int) -> str: ...


@dataclass(eq=False)
class WithTools:
    """A tokenizer whose renders all get ``tools``: the layout's probes then render the same
    tool declarations as the conversation (its probes are kept per such object, so per call)."""

    tokenizer: ChatTokenizer
    tools: Tools

    @property
    def eos_token_ids(self) -> list[int]:
        return self.tokenizer.eos_token_ids

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer.encode_batch(texts)

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, tools: Tools | None = None
    ) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt, tools or self.tools)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.token_text(token_id)


@dataclass
class ChatEncoding:
    """Per-message token ids of a prompt.

    ``segments[i]`` are message i's ids in the prompt (for an assistant message with
    stored ids: the template's header, those ids, then the template's tail);
    ``generation_prompt`` the ids that open the assistant's reply.
    """

    segments: list[list[int]] = field(default_factory=list)
    generation_prompt: list[int] = field(default_factory=list)
    exact: bool = True  # False if the template lacked the prefix property and we rendered it whole

    @property
    def token_ids(self) -> list[int]:
        return [t for seg in self.segments for t in seg] + self.generation_prompt
