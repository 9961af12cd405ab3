"""One user's changes that a per-user limit bounds, one after another across processes.

A limit checked by counting rows and then adding one holds only if no other request of
the same user counts in between: each such change locks the user's row first, inside its
transaction (``select_for_update``). On SQLite the site's transactions begin IMMEDIATE, so
writers are already serialised there and row locks do not exist: nothing is read."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import connection

from conversations.prepared_queries import PreparedRead

_locked_user = PreparedRead(
    lambda pk: get_user_model().objects.select_for_update().filter(pk=pk).values_list("pk").order_by()[:1]
)


def lock_user(user_id: int) -> None:
    """Hold the user's row until this transaction ends (call inside ``transaction.atomic``)."""
    if connection.features.has_select_for_update:
        _locked_user(user_id)
