"""Tool calls: how a model's answer carries function calls, per chat-template format.

``tool_format_for(tokenizer)`` picks the model's own format (Hermes/Qwen2.5 ``<tool_call>``,
Llama 3.1 JSON) from its chat template, else the documented generic one; a format
renders OpenAI-shaped messages and tools into plain messages the template can encode,
and parses a finished answer back into content and ``ToolCall``s.
"""

from inference.tools.calls import ToolCall, new_call_id
from inference.tools.formats import ToolFormat, tool_format_for

__all__ = ["ToolCall", "ToolFormat", "new_call_id", "tool_format_for"]
