"""Daily usage aggregates, one row per (UTC day, user, model, source), added to as answers
and API calls finish (``conversations.usage.record``): the usage pages read these, never a
scan of the messages. Time to first token is kept as a histogram (``TTFT_BOUNDS_MS``), so
percentiles of any set of rows come from adding their buckets."""

from __future__ import annotations

from django.conf import settings
from django.db import models

# Upper bounds (ms) of the time-to-first-token buckets; the last bucket is open.
TTFT_BOUNDS_MS = (50, 100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600)
TTFT_FIELDS = tuple(f"ttft_b{i}" for i in range(len(TTFT_BOUNDS_MS) + 1))


class UsageDay(models.Model):
    class Source(models.TextChoices):
        CHAT = "chat"
        API = "api"

    day = models.DateField(db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_days")
    model = models.CharField(max_length=200, blank=True, default="")
    source = models.CharField(max_length=8, choices=Source.choices)
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    # Answers whose first token came within each TTFT_BOUNDS_MS bucket (TTFT_FIELDS, in order).
    ttft_b0 = models.PositiveIntegerField(default=0)
    ttft_b1 = models.PositiveIntegerField(default=0)
    ttft_b2 = models.PositiveIntegerField(default=0)
    ttft_b3 = models.PositiveIntegerField(default=0)
    ttft_b4 = models.PositiveIntegerField(default=0)
    ttft_b5 = models.PositiveIntegerField(default=0)
    ttft_b6 = models.PositiveIntegerField(default=0)
    ttft_b7 = models.PositiveIntegerField(default=0)
    ttft_b8 = models.PositiveIntegerField(default=0)
    ttft_b9 = models.PositiveIntegerField(default=0)
    ttft_b10 = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["day", "user", "model", "source"], name="usage_day_unique_row")
        ]
        verbose_name = "daily usage"
        verbose_name_plural = "daily usage"

    def __str__(self) -> str:
        return f"{self.day} {self.user_id} {self.model} {self.source}"
