"""The OpenAI-compatible API (``conversations.api.app.api``, mounted at /v1) and the
settings page where users manage their API keys (``conversations.api.key_pages``)."""
