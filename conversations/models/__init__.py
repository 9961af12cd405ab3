from conversations.models.api import ApiKey, ApiRequest
from conversations.models.chat import Conversation, Message
from conversations.models.jobs import DataJob
from conversations.models.ops import EngineStatus
from conversations.models.workspace import Folder, Preset, Rating, Share

__all__ = [
    "ApiKey",
    "ApiRequest",
    "Conversation",
    "DataJob",
    "EngineStatus",
    "Folder",
    "Message",
    "Preset",
    "Rating",
    "Share",
]
