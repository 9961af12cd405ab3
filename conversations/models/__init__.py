from conversations.models.api import ApiKey, ApiRequest
from conversations.models.chat import Conversation, Message
from conversations.models.jobs import DataJob
from conversations.models.ops import EngineStatus
from conversations.models.tools import McpServer

__all__ = ["ApiKey", "ApiRequest", "Conversation", "DataJob", "EngineStatus", "McpServer", "Message"]
