from conversations.models.api import ApiKey, ApiRequest
from conversations.models.chat import Conversation, Message

__all__ = ["ApiKey", "ApiRequest", "Conversation", "Message"]
