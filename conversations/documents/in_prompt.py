"""A conversation's documents in its prompts.

- A document that fits (with the others that fit, at most ``WHOLE_SHARE`` of the
  context) comes in whole, at the very start of the system message, in a fixed form
  ordered by document id. Every turn of the conversation, and every conversation of the
  same user that attaches the same documents, starts with the same tokens, so their KV
  blocks are shared through the prefix cache, and KV retention keeps them (the open
  conversation's history mark starts with them). Such prompts share nothing with other
  users: their salt starts at token 0 (``shared_prefix_tokens`` = 0).
- Documents too large for that are searched: the question's top passages (BM25 fused
  with dense vectors) are put before the question in its user turn, with their sources.
  The turn's ids are stored as usual, so later turns reuse them verbatim.
- Either way the question's citations (file and passage) are stored on the question
  (``MessageSources``) and shown under its answers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from channels.db import database_sync_to_async

from conversations.documents.rendering import documents_system_prompt, with_passages
from conversations.documents.retrieval import Passage, load_chunks, rank
from conversations.models import ConversationDocument, DocumentChunk, MessageSources
from conversations.prepared_queries import PreparedRead

log = logging.getLogger(__name__)

# Whole documents may take this share of the context; larger ones are searched.
WHOLE_SHARE = 0.5
# Passages put into a question's turn, and citations shown for whole documents.
TOP_K = 4
EXCERPT_CHARS = 240


@dataclass
class AttachedDocuments:
    whole: list[tuple[int, str, str]] = field(default_factory=list)  # (id, filename, text)
    searched: list[int] = field(default_factory=list)  # ids of documents too large to come whole

    @property
    def any(self) -> bool:
        return bool(self.whole or self.searched)

    def system_prompt(self, own: str) -> str:
        """The system message: the whole documents first (a stable prefix), then ``own``."""
        return documents_system_prompt([(name, text) for _id, name, text in self.whole], own)


_ready_documents = PreparedRead(
    lambda conversation_id, owner_id: (
        ConversationDocument.objects.filter(
            conversation_id=conversation_id, document__owner_id=owner_id, document__status="ready"
        )
        .order_by("document_id")
        .values_list("document_id", "document__filename", "document__num_tokens")
    )
)


def attached(conversation_id: int, owner_id: int, max_model_len: int) -> AttachedDocuments:
    """Synchronous: the conversation's ready documents, whole or searched."""
    rows = _ready_documents(conversation_id, owner_id)
    docs = AttachedDocuments()
    room = int(max_model_len * WHOLE_SHARE)
    for doc_id, filename, num_tokens in rows:
        # A margin for the tags and for a chat tokenizer other than the embedder's.
        cost = int(num_tokens * 1.1) + 16
        if cost <= room:
            docs.whole.append((doc_id, filename, ""))
            room -= cost
        else:
            docs.searched.append(doc_id)
    if docs.whole:
        from conversations.models import Document  # noqa: PLC0415

        texts = dict(Document.objects.filter(pk__in=[d for d, _, _ in docs.whole]).values_list("id", "text"))
        docs.whole = [(d, name, texts.get(d, "")) for d, name, _ in docs.whole]
    return docs


async def attached_documents(conversation, max_model_len: int) -> AttachedDocuments:
    return await database_sync_to_async(attached)(conversation.pk, conversation.owner_id, max_model_len)


def _citation(n: int, p: Passage) -> dict:
    excerpt = p.text if len(p.text) <= EXCERPT_CHARS else p.text[:EXCERPT_CHARS].rsplit(" ", 1)[0] + "…"
    return {
        "n": n, "document_id": p.document_id, "filename": p.filename, "chunk_id": p.chunk_id,
        "heading": p.heading, "start": p.start, "end": p.end, "excerpt": excerpt,
    }  # fmt: skip


async def _search(owner_id: int, doc_ids: list[int], question: str) -> list[Passage]:
    from conversations.documents.embedder import aget_embedder  # noqa: PLC0415

    vector, model = None, ""
    try:
        embedder = await aget_embedder()
        vector, model = (await embedder.aembed_texts([question]))[0], embedder.model_name
    except Exception:  # no vectors: BM25 alone still answers
        log.exception("question embedding failed; ranking with BM25 alone")
    chunks = await database_sync_to_async(load_chunks)(owner_id, doc_ids, model)
    return await asyncio.to_thread(rank, chunks, question, vector, TOP_K)


@database_sync_to_async
def _stored_passages(message_id: int, owner_id: int) -> list[Passage] | None:
    """The passages the question's turn was given before (None: never grounded), read again
    from their chunks, so a rebuilt prompt (a retry, an earlier read) holds the same text."""
    row = MessageSources.objects.filter(message_id=message_id).values_list("passages", flat=True).first()
    if row is None:
        return None
    wanted = [p["chunk_id"] for p in row if p.get("in_prompt")]
    chunks = {
        c.pk: c
        for c in DocumentChunk.objects.filter(pk__in=wanted, owner_id=owner_id).select_related("document")
    }
    return [
        Passage(c.pk, c.document_id, c.document.filename, c.heading, c.text, c.start, c.end)
        for c in (chunks.get(i) for i in wanted)
        if c is not None
    ]


@database_sync_to_async
def _save_sources(message_id: int, passages: list[dict], whole: list[dict]) -> None:
    MessageSources.objects.update_or_create(
        message_id=message_id, defaults={"passages": passages, "whole": whole}
    )


async def ground_question(conversation, history: list[dict], docs: AttachedDocuments) -> None:
    """Put the searched documents' passages for the question ending ``history`` (a user turn
    without stored ids) into its turn; the first time, find them and store the question's
    citations, later (a retry) read the same passages back."""
    if not docs.any or not history or history[-1]["role"] != "user" or history[-1].get("token_ids"):
        return
    question = history[-1]
    owner = conversation.owner_id
    stored = await _stored_passages(question["id"], owner)
    if stored is not None:
        if stored:
            history[-1] = {**question, "content": with_passages(question["content"], stored)}
        return
    cited: list[dict] = []
    if docs.searched:
        found = await _search(owner, docs.searched, question["content"])
        if found:
            history[-1] = {**question, "content": with_passages(question["content"], found)}
        cited = [{**_citation(n, p), "in_prompt": True} for n, p in enumerate(found, start=1)]
    if docs.whole:  # the document is in the prompt whole: cite where the answer most likely is
        found = await _search(owner, [d for d, _, _ in docs.whole], question["content"])
        cited += [_citation(len(cited) + n, p) for n, p in enumerate(found[:2], start=1)]
    whole = [{"document_id": d, "filename": name} for d, name, _ in docs.whole]
    await _save_sources(question["id"], cited, whole)
