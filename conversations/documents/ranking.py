"""Ranking passages: BM25 (bm25s), exact dense search (numpy), reciprocal rank fusion.

No Django here: the functions take texts and vectors, so the benchmark runs them as the
site does. Vectors are L2-normalised float32 rows, so a dot product is the cosine.
"""

from __future__ import annotations

import numpy as np

# Reciprocal rank fusion's constant (Cormack et al.: 60).
RRF_K = 60
# How deep each ranking goes into the fusion.
DEPTH = 50


def _tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s  # noqa: PLC0415 - only when ranking

    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


def bm25_ranking(query: str, texts: list[str], depth: int = DEPTH) -> list[int]:
    """Indices of ``texts`` with a positive BM25 score for ``query``, best first."""
    import bm25s  # noqa: PLC0415

    if not texts:
        return []
    query_terms = _tokenize([query])[0]
    if not query_terms:
        return []
    retriever = bm25s.BM25()
    retriever.index(_tokenize(texts), show_progress=False)
    scores = np.asarray(retriever.get_scores(query_terms), dtype=np.float32)
    order = _top(scores, depth)
    return [int(i) for i in order if scores[i] > 0]


def _top(scores: np.ndarray, depth: int) -> np.ndarray:
    """The ``depth`` best indices, best first, by an O(n) partition then a small sort."""
    if len(scores) > depth:
        part = np.argpartition(-scores, depth - 1)[:depth]
        return part[np.argsort(-scores[part], kind="stable")]
    return np.argsort(-scores, kind="stable")


def dense_ranking(query_vector: np.ndarray, matrix: np.ndarray, depth: int = DEPTH) -> list[int]:
    """Rows of ``matrix`` ([n, dim] float32) nearest ``query_vector`` by cosine, best first:
    an exact search (every row scored)."""
    if matrix.size == 0:
        return []
    scores = matrix @ query_vector.astype(np.float32, copy=False)
    return [int(i) for i in _top(scores, depth)]


def reciprocal_rank_fusion(rankings: list[list[int]], k: int = RRF_K) -> list[int]:
    """Items of several best-first rankings ordered by the sum of 1 / (k + rank)."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda item: (-scores[item], item))


def vectors_from_bytes(blobs: list[bytes | None], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The stored float32 rows as one matrix, and a mask of the rows that had one."""
    matrix = np.zeros((len(blobs), dim), dtype=np.float32)
    present = np.zeros(len(blobs), dtype=bool)
    for i, blob in enumerate(blobs):
        if blob is not None and len(blob) == 4 * dim:
            matrix[i] = np.frombuffer(bytes(blob), dtype="<f4")
            present[i] = True
    return matrix, present
