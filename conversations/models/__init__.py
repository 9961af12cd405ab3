from conversations.models.access import GroupAccess, TokenQuota
from conversations.models.api import ApiKey, ApiRequest
from conversations.models.audit import AuditEvent
from conversations.models.chat import Conversation, Message, ModelPreference
from conversations.models.documents import ConversationDocument, Document, DocumentChunk, MessageSources
from conversations.models.identity import ExternalIdentity
from conversations.models.jobs import DataJob
from conversations.models.ops import EngineStatus
from conversations.models.tools import McpServer
from conversations.models.usage import UsageDay
from conversations.models.workspace import Folder, Preset, Rating, Share

__all__ = [
    "ApiKey",
    "ApiRequest",
    "AuditEvent",
    "Conversation",
    "ConversationDocument",
    "DataJob",
    "Document",
    "DocumentChunk",
    "EngineStatus",
    "ExternalIdentity",
    "GroupAccess",
    "Folder",
    "McpServer",
    "Message",
    "MessageSources",
    "ModelPreference",
    "Preset",
    "Rating",
    "Share",
    "TokenQuota",
    "UsageDay",
]
