"""A user's files, their extracted text in chunks, and what conversations draw on them.

A document belongs to its uploader alone: every query filters by owner. The uploaded
bytes stay on the row until extraction has read them (a Celery job), then are cleared.
Chunk vectors are float32 bytes (``DocumentChunk.embedding``), searched exactly with
numpy; the PostgreSQL server here has no pgvector extension to install.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Document(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        EXTRACTING = "extracting"
        READY = "ready"
        FAILED = "failed"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="documents")
    filename = models.CharField(max_length=255)
    # pdf | text | markdown | html | docx | code
    kind = models.CharField(max_length=16)
    size = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    # Extraction progress, 0-100, for the page's progress bar.
    progress = models.IntegerField(default=0)
    error = models.TextField(blank=True, default="")
    # The upload until extraction read it.
    payload = models.BinaryField(null=True, blank=True)
    text = models.TextField(blank=True, default="")
    pages = models.IntegerField(default=0)
    num_tokens = models.IntegerField(default=0)
    # The embedder whose vectors the chunks hold (model name); '' = none computed.
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return self.filename


class DocumentChunk(models.Model):
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    # Kept beside the document's for per-user searches without a join.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    index = models.IntegerField()
    heading = models.CharField(max_length=300, blank=True, default="")
    text = models.TextField()
    # Where the passage sits in Document.text (characters), to open it there.
    start = models.IntegerField(default=0)
    end = models.IntegerField(default=0)
    num_tokens = models.IntegerField(default=0)
    embedding = models.BinaryField(null=True, blank=True)

    class Meta:
        ordering = ["document", "index"]
        constraints = [models.UniqueConstraint(fields=["document", "index"], name="unique_chunk_index")]
        indexes = [models.Index(fields=["owner", "document"])]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.index}"


class ConversationDocument(models.Model):
    """A document a conversation draws on (attached with a message, or from the library)."""

    conversation = models.ForeignKey("Conversation", on_delete=models.CASCADE, related_name="attachments")
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="attachments")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "document"], name="unique_conversation_document")
        ]


class MessageSources(models.Model):
    """The passages retrieved for a question, shown as its answers' citations."""

    message = models.OneToOneField("Message", on_delete=models.CASCADE, related_name="sources")
    # [{"n", "document_id", "filename", "chunk_id", "heading", "start", "end", "excerpt"}]
    passages = models.JSONField(default=list)
    # Whole documents the prompt held instead: [{"document_id", "filename"}]
    whole = models.JSONField(default=list)
