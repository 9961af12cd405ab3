"""The passages of a user's documents that answer a question: BM25 and dense vectors,
fused by reciprocal rank. Every read filters by the owner, so another user's chunks
never come back whatever ids are asked for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conversations.documents.ranking import (
    bm25_ranking,
    dense_ranking,
    reciprocal_rank_fusion,
    vectors_from_bytes,
)
from conversations.models import DocumentChunk


@dataclass
class Passage:
    chunk_id: int
    document_id: int
    filename: str
    heading: str
    text: str
    start: int
    end: int


@dataclass
class ChunkSet:
    passages: list[Passage]
    matrix: np.ndarray  # [n, dim] float32 (zeros where a chunk has no vector)
    present: np.ndarray  # [n] bool: the chunk has a vector of the embedder in use


def load_chunks(owner_id: int, document_ids: list[int], embedding_model: str) -> ChunkSet:
    """Synchronous: the ready documents' chunks, with vectors made by ``embedding_model``."""
    rows = list(
        DocumentChunk.objects.filter(
            owner_id=owner_id, document_id__in=document_ids, document__status="ready"
        )
        .order_by("document_id", "index")
        .values_list(
            "id", "document_id", "document__filename", "heading", "text", "start", "end",
            "embedding", "document__embedding_model",
        )
    )  # fmt: skip
    passages = [Passage(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]
    blobs = [bytes(r[7]) if r[7] is not None and r[8] == embedding_model else None for r in rows]
    dim = next((len(b) // 4 for b in blobs if b), 0)
    matrix, present = (
        vectors_from_bytes(blobs, dim)
        if dim
        else (np.zeros((len(rows), 0), np.float32), np.zeros(len(rows), bool))
    )
    return ChunkSet(passages, matrix, present)


def rank(chunks: ChunkSet, query: str, query_vector: np.ndarray | None, top_k: int) -> list[Passage]:
    """The ``top_k`` passages by BM25 fused with the dense ranking (BM25 alone when no
    vectors exist)."""
    texts = [f"{p.heading}\n{p.text}" if p.heading else p.text for p in chunks.passages]
    rankings = [bm25_ranking(query, texts)]
    if query_vector is not None and chunks.present.any() and chunks.matrix.shape[1] == len(query_vector):
        dense = [i for i in dense_ranking(query_vector, chunks.matrix) if chunks.present[i]]
        rankings.append(dense)
    order = reciprocal_rank_fusion(rankings)
    return [chunks.passages[i] for i in order[:top_k]]
