"""What the prompt encoder takes and gives: a tokenizer with a chat template, and each
message's ids apart."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# A chat message: ``role`` and ``content``, and optionally ``token_ids`` (see ``encode_segments``).
Message = Mapping[str, Any]


class ChatTokenizer(Protocol):
    """The part of ``inference.tokenizer.Tokenizer`` the encoder uses (a protocol, so the
    tokenizer module can hand itself to the encoder without an import circle)."""

    eos_token_ids: list[int]

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str: ...

    def token_text(self, token_id: int) -> str: ...


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
