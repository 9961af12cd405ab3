"""A user's rights, from their groups' ``GroupAccess`` rows: the union (a right any of their
groups grants, the largest cap any of them sets). Groups without a row add nothing; a user
none of whose groups has a row gets the site's defaults (everything, the settings' caps).
Group membership comes from the identity provider's claim for SSO users
(``conversations.accounts.sso.backend``) and from the admin for local accounts."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from conversations.models import GroupAccess


@dataclass(frozen=True)
class Access:
    models: frozenset[str] | None  # None: every model
    api: bool
    sharing: bool
    public_sharing: bool
    document_max_files: int
    document_max_bytes: int
    scheduler_weight: float = 1.0

    def may_use_model(self, name: str) -> bool:
        return self.models is None or name in self.models


def site_default() -> Access:
    return Access(
        models=None,
        api=True,
        sharing=True,
        public_sharing=True,
        document_max_files=settings.DOCUMENT_USER_MAX_FILES,
        document_max_bytes=settings.DOCUMENT_USER_MAX_BYTES,
    )


def access_for(user_id: int) -> Access:
    rows = list(GroupAccess.objects.filter(group__user__id=user_id).order_by())
    if not rows:
        return site_default()
    every_model = any(not row.allowed_models for row in rows)
    return Access(
        models=None if every_model else frozenset(name for row in rows for name in row.allowed_models),
        api=any(row.api for row in rows),
        sharing=any(row.sharing for row in rows),
        public_sharing=any(row.public_sharing for row in rows),
        document_max_files=max(
            settings.DOCUMENT_USER_MAX_FILES if row.document_max_files is None else row.document_max_files
            for row in rows
        ),
        document_max_bytes=max(
            settings.DOCUMENT_USER_MAX_BYTES if row.document_max_bytes is None else row.document_max_bytes
            for row in rows
        ),
        scheduler_weight=max(row.scheduler_weight for row in rows),
    )
