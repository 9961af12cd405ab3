"""Chat prompts as token ids: one encoder for the chat, ``/v1``, titles, cache salts and the
offline ``LLM``, linear in the number of messages and stable across turns
(``inference.prompt.encoder``)."""

from inference.prompt.encoder import encode_chat, encode_segments
from inference.prompt.types import ChatEncoding, ChatTokenizer

__all__ = ["ChatEncoding", "ChatTokenizer", "encode_chat", "encode_segments"]
