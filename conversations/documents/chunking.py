"""A document's text in passages for retrieval: by structure, bounded in tokens, overlapping.

The text is read as blocks (paragraphs: runs of lines between blank lines) under the
Markdown headings above them. Consecutive blocks of one section are packed into a chunk
while it stays within ``max_tokens``; a new heading always starts a new chunk, and each
chunk is labelled with its heading path. The next chunk of the same section starts with
the previous chunk's last blocks, up to ``overlap_tokens``. A block longer than a chunk
is cut into windows of sentences (or of words) with the same overlap. Each chunk keeps
its character span in the text, so a citation can open the passage.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
BLOCK = re.compile(r"\S(?:.*?\S)?(?=[ \t]*\n[ \t]*\n|\s*\Z)", re.S)
SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+[\"')\]]*|\n|$)\s*")

CountTokens = Callable[[str], int]


@dataclass
class Chunk:
    index: int
    heading: str
    text: str
    start: int
    end: int
    num_tokens: int


@dataclass
class _Block:
    start: int
    end: int
    tokens: int


def approximate_tokens(text: str) -> int:
    """About 4 characters a token, for callers without a tokenizer (never 0 for text)."""
    return max(1, len(text) // 4) if text else 0


def _blocks(text: str) -> list[tuple[int, int, str | None]]:
    """(start, end, heading line's title or None) of each paragraph."""
    out = []
    for match in BLOCK.finditer(text):
        first_line = match.group(0).split("\n", 1)[0]
        heading = HEADING.match(first_line)
        if heading and "\n" not in match.group(0).strip():
            out.append((match.start(), match.end(), f"{heading.group(1)} {heading.group(2)}"))
        else:
            out.append((match.start(), match.end(), None))
    return out


def _pieces(text: str, start: int, end: int, count: CountTokens, window: int) -> list[_Block]:
    """A paragraph as sentences; a sentence longer than ``window`` tokens as runs of words
    of about ``window`` tokens (so the overlap can be made of whole pieces)."""
    spans = [(start + m.start(), start + m.end()) for m in SENTENCE.finditer(text[start:end]) if m.group(0)]
    out: list[_Block] = []
    for s, e in spans or [(start, end)]:
        n = count(text[s:e])
        if n <= window:
            out.append(_Block(s, e, n))
            continue
        words = [(s + m.start(), s + m.end()) for m in re.finditer(r"\S+\s*", text[s:e])]
        step = max(1, len(words) * window // (n + 1))
        for i in range(0, len(words), step):
            ws, we = words[i][0], words[min(len(words), i + step) - 1][1]
            out.append(_Block(ws, we, count(text[ws:we])))
    return out


class _Packer:
    """Pieces into chunks: a chunk ends before the piece that would overflow it, or at a
    paragraph when that paragraph does not fit and the chunk is half full; the next chunk
    of the section starts with the last pieces of the one before, up to the overlap."""

    def __init__(self, text: str, count: CountTokens, max_tokens: int, overlap: int) -> None:
        self.text, self.count, self.max_tokens, self.overlap = text, count, max_tokens, overlap
        self.chunks: list[Chunk] = []
        self.current: list[_Block] = []
        self.fresh = 0  # pieces of ``current`` not already in the previous chunk
        self.heading = ""

    @property
    def tokens(self) -> int:
        return sum(b.tokens for b in self.current)

    def paragraph(self, pieces: list[_Block], heading: str) -> None:
        if heading != self.heading:
            self.flush()
            self.heading = heading
        size = sum(b.tokens for b in pieces)
        if self.fresh and self.tokens + size > self.max_tokens and self.tokens * 2 >= self.max_tokens:
            self.flush(keep_overlap=True)
        for piece in pieces:
            if self.current and self.tokens + piece.tokens > self.max_tokens:
                self.flush(keep_overlap=True)
                while self.current and self.tokens + piece.tokens > self.max_tokens:
                    self.current.pop(0)
            self.current.append(piece)
            self.fresh += 1

    def flush(self, keep_overlap: bool = False) -> None:
        if self.current and self.fresh:
            start, end = self.current[0].start, self.current[-1].end
            body = self.text[start:end]
            self.chunks.append(Chunk(len(self.chunks), self.heading, body, start, end, self.count(body)))
        kept: list[_Block] = []
        if keep_overlap:
            for block in reversed(self.current):
                if sum(b.tokens for b in kept) + block.tokens > self.overlap:
                    break
                kept.insert(0, block)
        self.current, self.fresh = kept, 0


def chunk_text(
    text: str, *, count: CountTokens = approximate_tokens, max_tokens: int = 256, overlap_tokens: int = 48
) -> list[Chunk]:
    if max_tokens < 1 or overlap_tokens < 0 or overlap_tokens >= max_tokens:
        raise ValueError("need max_tokens >= 1 and 0 <= overlap_tokens < max_tokens")
    packer = _Packer(text, count, max_tokens, overlap_tokens)
    window = max(1, min(max_tokens, max(overlap_tokens, max_tokens // 4)))
    path: list[tuple[int, str]] = []  # (level, title) of the headings above
    heading = ""
    for start, end, title in _blocks(text):
        if title is not None:
            level = len(title) - len(title.lstrip("#"))
            path = [(lv, t) for lv, t in path if lv < level] + [(level, title.lstrip("# "))]
            heading = " › ".join(t for _, t in path)[:300]
            packer.paragraph([], heading)
            continue
        packer.paragraph(_pieces(text, start, end, count, window), heading)
    packer.flush()
    return packer.chunks
