"""Operations models: the engine status page's placeholder (no table of its own)."""

from __future__ import annotations

from django.db import models


class EngineStatus(models.Model):
    """No table: gives the admin a read-only "Engine status" page (see conversations.ops.admin)."""

    class Meta:
        managed = False
        verbose_name = "engine status"
        verbose_name_plural = "engine status"
        default_permissions = ("view",)
