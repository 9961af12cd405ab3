"""What a request's output must match."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "choice", "ebnf", "structural_tag")


@dataclass(frozen=True)
class GrammarSpec:
    """``kind`` and its ``source`` text: a JSON schema, a regex, a JSON list of choices, an
    EBNF/GBNF grammar (root rule ``root``) or an xgrammar structural tag (JSON)."""

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str):
            raise ValueError("grammar source must be a string")

    @property
    def key(self) -> str:
        """Cache key: a hash of the kind and source (the same schema compiles once)."""
        return hashlib.sha256(f"{self.kind}\0{self.source}".encode()).hexdigest()

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> GrammarSpec:
        # Key order is kept: it is the order the properties are generated in.
        text = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
        return cls("json_schema", text)

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: list[str]) -> GrammarSpec:
        return cls("choice", json.dumps(list(choices), ensure_ascii=False))

    @classmethod
    def ebnf(cls, grammar: str) -> GrammarSpec:
        return cls("ebnf", grammar)

    @classmethod
    def structural_tag(cls, tag: dict[str, Any]) -> GrammarSpec:
        return cls("structural_tag", json.dumps(tag, ensure_ascii=False))
