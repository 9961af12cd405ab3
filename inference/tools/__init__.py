"""Tool calls: how a model's answer carries function calls, per model family.

``tool_format_for(tokenizer)`` picks the model's own format from the markers its chat
template writes (``inference.tools.formats``: Hermes/Qwen ``<tool_call>``, Llama 3 JSON,
Mistral ``[TOOL_CALLS]``, Granite ``<|tool_call|>``, gpt-oss harmony), else the documented
generic one; a format renders OpenAI-shaped messages and tools into plain messages the
template can encode, and reads calls back out of an answer, streamed or whole, with the one
parser of ``inference.tools.streaming``.
"""

from inference.tools.calls import ToolCall, new_call_id
from inference.tools.formats import ToolFormat, tool_format_for

__all__ = ["ToolCall", "ToolFormat", "new_call_id", "tool_format_for"]
