"""Chunks follow the structure, stay within their token bound and overlap; the rankers."""

from __future__ import annotations

import numpy as np
import pytest

from conversations.documents.chunking import approximate_tokens, chunk_text
from conversations.documents.ranking import bm25_ranking, dense_ranking, reciprocal_rank_fusion

TEXT = (
    "# Guide\n\nWelcome to the guide.\n\n## Boats\n\n"
    + "\n\n".join(f"Boat paragraph {i}. " + "The hull floats on water. " * 12 for i in range(6))
    + "\n\n## Trains\n\nTrains run on rails. They carry freight."
)


@pytest.mark.smoke
def test_chunks_are_bounded_labelled_and_overlapping():
    chunks = chunk_text(TEXT, max_tokens=120, overlap_tokens=30)
    assert all(c.num_tokens <= 120 for c in chunks)
    assert all(TEXT[c.start : c.end] == c.text for c in chunks)
    assert [c.heading for c in chunks][0] == "Guide"
    assert chunks[-1].heading == "Guide › Trains" and chunks[-1].text.startswith("Trains run")
    boats = [c for c in chunks if c.heading == "Guide › Boats"]
    assert len(boats) > 2
    assert all(a.end > b.start for a, b in zip(boats, boats[1:], strict=False))  # overlap
    assert not any("Trains" in c.text for c in boats)  # a heading starts a new chunk


def test_a_run_on_paragraph_is_cut_into_windows():
    chunks = chunk_text("word " * 2000, max_tokens=100, overlap_tokens=20)
    assert len(chunks) > 10 and all(c.num_tokens <= 100 for c in chunks)
    covered = set()
    for c in chunks:
        covered.update(range(c.start, c.end))
    assert len(covered) >= len(("word " * 2000).strip())


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        chunk_text("x", max_tokens=10, overlap_tokens=10)
    assert approximate_tokens("") == 0


def test_bm25_finds_the_term_and_ignores_absent_ones():
    texts = ["the cat sat on the mat", "dogs bark loudly", "a cat and a dog"]
    assert bm25_ranking("cat", texts)[:2] in ([0, 2], [2, 0])
    assert bm25_ranking("zebra", texts) == []
    assert bm25_ranking("the", texts) == []  # stop words only


def test_dense_search_is_exact_and_fusion_rewards_agreement():
    rng = np.random.default_rng(0)
    matrix = rng.normal(size=(1000, 16)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    query = matrix[123] + 0.01
    assert dense_ranking(query, matrix, depth=5)[0] == 123
    full = np.argsort(-(matrix @ query))[:20].tolist()
    assert dense_ranking(query, matrix, depth=20) == full
    assert reciprocal_rank_fusion([[1, 2, 3], [4, 2, 5]])[:3] == [2, 1, 4]
