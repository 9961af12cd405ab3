"""The text of an HTML page through the standard library's parser: scripts, styles and
other non-content elements dropped, blocks on lines of their own, headings as Markdown."""

from __future__ import annotations

import re
from html.parser import HTMLParser

SKIP = {"script", "style", "noscript", "template", "svg", "iframe", "object"}
BLOCKS = {
    "p", "div", "section", "article", "li", "ul", "ol", "table", "tr", "br", "pre", "blockquote",
    "header", "footer", "main", "nav", "aside", "figure", "figcaption", "dd", "dt", "hr", "title",
}  # fmt: skip
HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in SKIP:
            self.skipping += 1
        elif tag in HEADINGS:
            self.parts.append("\n\n" + "#" * HEADINGS[tag] + " ")
        elif tag in BLOCKS:
            self.parts.append("\n\n" if tag != "br" else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in HEADINGS or tag in BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _TextParser()
    parser.feed(html)
    parser.close()
    text = "".join(parser.parts)
    lines = [re.sub(r"[ \t\f\v]+", " ", line).strip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
