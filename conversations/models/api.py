"""API keys for the OpenAI-compatible API, and the requests made with them."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from conversations.accounts.user_rows import user_by_id
from conversations.prepared_queries import PreparedRead

KEY_PREFIX = "sk-"
# Characters of the key kept in clear ("sk-" and 9 random ones), to tell keys apart.
PREFIX_LENGTH = 12


def hash_key(raw_key: str) -> str:
    """The stored form of a key. Keys carry 256 random bits, so one SHA-256 is enough
    (a slow password hash would only slow every API call down)."""
    return hashlib.sha256(raw_key.encode()).hexdigest()


def new_raw_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKeyQuerySet(models.QuerySet):
    def active(self) -> ApiKeyQuerySet:
        return self.filter(revoked_at__isnull=True, owner__is_active=True)

    def create_key(self, owner, name: str = "") -> tuple[ApiKey, str]:
        """Create a key for ``owner``; returns it with the raw key, which is never stored."""
        key = self.model(owner=owner, name=name)
        raw = key.set_new_key()
        key.save()
        return key, raw

    def revoke(self) -> int:
        return self.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())

    def find(self, raw_key: str) -> ApiKey | None:
        """The key matching ``raw_key`` (revoked or not), with its owner, or None, among all
        keys (this queryset's filters do not apply). Every API call asks: two prepared reads,
        where a ``select_related`` query would be compiled anew each time."""
        found = _key_by_hash(hash_key(raw_key))
        if not found:
            return None
        key = found[0]
        owners = user_by_id(key.owner_id)
        if not owners:  # deleted in between
            return None
        key.owner = owners[0]
        return key


_key_by_hash = PreparedRead(lambda hashed: ApiKey.objects.filter(hashed_key=hashed).order_by()[:1])


class ApiKey(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    # Only a hash is stored; the prefix lets a user tell keys apart after creation.
    prefix = models.CharField(max_length=16, db_index=True, editable=False)
    hashed_key = models.CharField(max_length=128, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Requests per minute for this key; empty means the site's API_RATE_LIMIT_PER_MINUTE.
    rate_limit_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Requests per minute for this key. Empty: the site default (API_RATE_LIMIT_PER_MINUTE).",
    )

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        label = f"{self.prefix}…"
        return f"{label} {self.name}" if self.name else label

    def set_new_key(self) -> str:
        """Give this (unsaved) key a fresh secret; returns the raw key to show once."""
        raw = new_raw_key()
        self.prefix = raw[:PREFIX_LENGTH]
        self.hashed_key = hash_key(raw)
        return raw

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class ApiRequest(models.Model):
    """One API call, counted against the key's owner; no conversation is created."""

    key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL, related_name="requests")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_requests")
    # The response id (chatcmpl-…/cmpl-…), also the engine's request id.
    request_id = models.CharField(max_length=64, blank=True, default="", db_index=True)
    endpoint = models.CharField(max_length=64)
    model = models.CharField(max_length=200, blank=True, default="")
    # 499: the client disconnected before the answer was complete.
    status_code = models.IntegerField(default=200)
    stream = models.BooleanField(default=False)
    prompt_tokens = models.IntegerField(default=0)
    completion_tokens = models.IntegerField(default=0)
    cached_tokens = models.IntegerField(default=0)
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    error = models.TextField(blank=True, default="")
    duration_ms = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API request"

    def __str__(self) -> str:
        return f"{self.endpoint} {self.status_code} ({self.owner})"
