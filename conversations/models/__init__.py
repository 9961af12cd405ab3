from conversations.models.api import ApiKey, ApiRequest
from conversations.models.chat import Conversation, Message, ModelPreference
from conversations.models.documents import ConversationDocument, Document, DocumentChunk, MessageSources
from conversations.models.jobs import DataJob
from conversations.models.ops import EngineStatus
from conversations.models.tools import McpServer
from conversations.models.workspace import Folder, Preset, Rating, Share

__all__ = [
    "ApiKey",
    "ApiRequest",
    "Conversation",
    "ConversationDocument",
    "DataJob",
    "Document",
    "DocumentChunk",
    "EngineStatus",
    "Folder",
    "McpServer",
    "Message",
    "MessageSources",
    "ModelPreference",
    "Preset",
    "Rating",
    "Share",
]
