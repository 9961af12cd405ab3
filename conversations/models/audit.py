"""The audit log: who did what, when, from where, to which object. Append-only.

An entry is written in the same transaction as the change it records
(``conversations.audit.log.record``), so a change that rolls back leaves no entry and an
entry never describes a change that did not happen.

Nothing edits an entry: ``save`` refuses a row that exists, ``delete`` and the queryset's
``update`` and ``delete`` raise, and the migration adds a database trigger that aborts any
``UPDATE`` of the table (on SQLite and PostgreSQL alike), so not even raw SQL through the
site changes one. Entries leave only through retention (``prune_before``), which deletes
whole rows older than ``AUDIT_RETENTION_DAYS``.

The actor is kept as an id and a name, not a foreign key: deleting a user must not rewrite
(set null) or remove (cascade) the entries that describe what they did.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models


class AppendOnly(Exception):
    """An attempt to change or delete an audit entry."""


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnly("audit entries cannot be changed")

    def delete(self):
        raise AppendOnly("audit entries cannot be deleted (retention removes old ones)")

    def prune_before(self, cutoff: datetime) -> int:
        """Delete the entries older than ``cutoff``: the retention sweep's one way out."""
        old = self.model.objects.filter(created_at__lt=cutoff)
        count = old.count()
        old._raw_delete(old.db)
        return count


class AuditEvent(models.Model):
    class Action(models.TextChoices):
        SIGN_IN = "auth.sign_in", "signed in"
        SIGN_OUT = "auth.sign_out", "signed out"
        SIGN_IN_FAILED = "auth.sign_in_failed", "failed to sign in"
        API_KEY_CREATE = "api_key.create", "created an API key"
        API_KEY_REVOKE = "api_key.revoke", "revoked an API key"
        SHARE_CREATE = "share.create", "created a share link"
        SHARE_REVOKE = "share.revoke", "revoked a share link"
        MCP_SERVER_CREATE = "mcp_server.create", "added an MCP server"
        MCP_SERVER_CHANGE = "mcp_server.change", "changed an MCP server"
        MCP_SERVER_DELETE = "mcp_server.delete", "deleted an MCP server"
        GROUP_CREATE = "group.create", "created a group"
        GROUP_CHANGE = "group.change", "changed a group"
        GROUP_DELETE = "group.delete", "deleted a group"
        GROUP_MEMBERSHIP = "group.membership", "changed group membership"
        ROLE_CHANGE = "user.role", "changed a user's role"
        EXPORT = "data.export", "exported data"
        IMPORT = "data.import", "imported data"
        ADMIN_DELETE = "admin.delete", "deleted through the admin"
        QUOTA_CHANGE = "quota.change", "changed a token quota"
        QUOTA_EXHAUSTED = "quota.exhausted", "ran out of a token quota"
        AUDIT_EXPORT = "audit.export", "exported the audit log"
        AUDIT_PRUNE = "audit.prune", "removed expired audit entries"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # Empty for anonymous actors (a failed sign-in) and the system (retention).
    actor_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    actor_name = models.CharField(max_length=150, blank=True, default="")
    address = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=40, choices=Action.choices, db_index=True)
    # The object acted on: its model label ("auth.group"), key and a readable name.
    object_type = models.CharField(max_length=100, blank=True, default="")
    object_id = models.CharField(max_length=64, blank=True, default="")
    object_repr = models.CharField(max_length=200, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "audit entry"
        verbose_name_plural = "audit log"
        default_permissions = ("view",)

    def __str__(self) -> str:
        who = self.actor_name or "anonymous"
        what = self.get_action_display()
        return f"{who} {what} {self.object_repr}".strip()

    def save(self, *args, **kwargs) -> None:
        if not self._state.adding:
            raise AppendOnly("audit entries cannot be changed")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnly("audit entries cannot be deleted (retention removes old ones)")

    def as_record(self) -> dict:
        """The entry as one JSON object (the JSONL export's line)."""
        return {
            "id": self.pk,
            "time": self.created_at.isoformat(),
            "actor_id": self.actor_id,
            "actor": self.actor_name,
            "address": self.address,
            "action": self.action,
            "object_type": self.object_type,
            "object_id": self.object_id,
            "object": self.object_repr,
            "detail": self.detail,
        }
