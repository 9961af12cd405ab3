"""Export and import jobs a user started from the data page, run by Celery tasks.

The uploaded file and the finished export are kept in the row (not on a disk the worker
and the site might not share); housekeeping deletes jobs after ``DATA_JOB_RETENTION_HOURS``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class DataJob(models.Model):
    class Kind(models.TextChoices):
        EXPORT = "export"
        IMPORT = "import"

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="data_jobs")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    # Export: "json" or "markdown". Import: "" until the file's shape is detected, then "ours"/"chatgpt".
    format = models.CharField(max_length=16, blank=True, default="")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    filename = models.CharField(max_length=200, blank=True, default="")
    # Import: the uploaded bytes (cleared once read). Export: the finished file.
    payload = models.BinaryField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    # Done so far: an import counts up batch by batch, of ``total`` (the conversations in
    # its file, known once the file is read).
    conversations = models.IntegerField(default=0)
    messages = models.IntegerField(default=0)
    total = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.status} ({self.owner})"

    @property
    def ready(self) -> bool:
        return self.kind == self.Kind.EXPORT and self.status == self.Status.DONE

    @property
    def content_type(self) -> str:
        return "text/markdown; charset=utf-8" if self.format == "markdown" else "application/json"
