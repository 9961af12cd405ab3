"""API keys for the OpenAI-compatible API, and the requests made with them."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    # Only a hash is stored; the prefix lets a user tell keys apart after creation.
    prefix = models.CharField(max_length=16, db_index=True)
    hashed_key = models.CharField(max_length=128, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.owner})"


class ApiRequest(models.Model):
    """One API call, counted against the key's owner; no conversation is created."""

    key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL, related_name="requests")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_requests")
    endpoint = models.CharField(max_length=64)
    model = models.CharField(max_length=200, blank=True, default="")
    status_code = models.IntegerField(default=200)
    stream = models.BooleanField(default=False)
    prompt_tokens = models.IntegerField(default=0)
    completion_tokens = models.IntegerField(default=0)
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    duration_ms = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
