"""A user's row by its key, as a prepared read: every websocket connect and API call needs
one, and building Django's query each time cost several times running it."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from conversations.prepared_queries import PreparedRead

user_by_id = PreparedRead(lambda pk: get_user_model()._default_manager.filter(pk=pk).order_by()[:1])
