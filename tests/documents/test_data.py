"""The benchmark's documents and questions: every expected passage is in its file's text."""

from __future__ import annotations

import json
from pathlib import Path

from conversations.documents.extract import extract
from conversations.documents.formats import kind_of

DATA = Path(__file__).resolve().parents[1] / "data" / "documents"


def test_every_question_has_its_passage_in_its_document():
    texts = {
        p.name: extract(p.name, kind_of(p.name), p.read_bytes(), max_pages=1000).text
        for p in DATA.iterdir()
        if p.suffix != ".json"
    }
    questions = json.loads((DATA / "questions.json").read_text())
    assert len(texts) == 5 and len(questions) >= 30
    assert {q["file"] for q in questions} == set(texts)
    missing = [q for q in questions if q["expected"] not in texts[q["file"]]]
    assert missing == []
