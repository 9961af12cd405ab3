"""The admin registry: each part of the site registers its own models' admin.

Users are administered through Django's own UserAdmin (registered by django.contrib.auth).
"""

from conversations.accounts import admin as accounts_admin  # noqa: F401 - SSO identities
from conversations.api import admin as api_admin  # noqa: F401 - API keys and the usage log
from conversations.audit import admin as audit_admin  # noqa: F401 - the audit log; User and Group admins
from conversations.chat import admin as chat_admin  # noqa: F401 - conversations and messages
from conversations.ops import admin as ops_admin  # noqa: F401 - the engine status page
from conversations.tools import admin as tools_admin  # noqa: F401 - MCP servers and who may use them
from conversations.workspace import admin as workspace_admin  # noqa: F401 - ratings, presets, shares, folders
