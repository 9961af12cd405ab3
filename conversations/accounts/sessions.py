"""Django's database sessions, read with SQL built once (``conversations.prepared_queries``).

Every page and every websocket connect reads its session; the ORM's building of that one
lookup cost more than the database's answer to it. The row is read by its key alone and its
expiry checked here, which matches what Django's store asks of the database."""

from __future__ import annotations

from django.contrib.sessions.backends import db
from django.contrib.sessions.models import Session
from django.utils import timezone

from conversations.prepared_queries import PreparedRead

_session_by_key = PreparedRead(lambda key: Session.objects.filter(session_key=key).order_by()[:1])


class SessionStore(db.SessionStore):
    def _get_session_from_db(self) -> Session | None:
        found = _session_by_key(self.session_key) if self.session_key else []
        if found and found[0].expire_date > timezone.now():
            return found[0]
        self._session_key = None
        return None
