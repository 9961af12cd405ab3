"""How documents read in a prompt (no Django: the benchmark renders prompts the same way).

The form is fixed, so the same documents always give the same leading tokens."""

from __future__ import annotations

from typing import Protocol

PREAMBLE = "The user attached these documents. Answer from them when they are relevant."


class PassageLike(Protocol):
    filename: str
    heading: str
    text: str


def documents_system_prompt(whole: list[tuple[str, str]], own: str) -> str:
    """The system message: ``whole`` documents ((filename, text), in a fixed order) first,
    then the conversation's own system prompt."""
    if not whole:
        return own
    parts = [PREAMBLE]
    for filename, text in whole:
        parts.append(f'<document name="{filename}">\n{text}\n</document>')
    if own:
        parts.append(own)
    return "\n\n".join(parts)


def with_passages(question: str, passages: list[PassageLike]) -> str:
    """The question's turn with the passages found for it before it, each with its source."""
    blocks = []
    for n, p in enumerate(passages, start=1):
        where = f"{p.filename}" + (f", {p.heading}" if p.heading else "")
        blocks.append(f"[{n}] ({where})\n{p.text}")
    return "Passages from my documents:\n\n" + "\n\n".join(blocks) + f"\n\nQuestion: {question}"
