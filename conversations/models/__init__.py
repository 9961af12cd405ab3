from conversations.models.api import ApiKey, ApiRequest
from conversations.models.chat import Conversation, Message
from conversations.models.documents import ConversationDocument, Document, DocumentChunk, MessageSources
from conversations.models.jobs import DataJob
from conversations.models.ops import EngineStatus

__all__ = [
    "ApiKey",
    "ApiRequest",
    "Conversation",
    "ConversationDocument",
    "DataJob",
    "Document",
    "DocumentChunk",
    "EngineStatus",
    "Message",
    "MessageSources",
]
