from conversations.models.api import ApiKey, ApiRequest
from conversations.models.chat import Conversation, Message
from conversations.models.jobs import DataJob

__all__ = ["ApiKey", "ApiRequest", "Conversation", "DataJob", "Message"]
