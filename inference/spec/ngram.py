"""Prompt lookup: propose the tokens that followed the last occurrence of the
sequence's current suffix in its own prompt and output.

An edit of pasted code or a rewrite of quoted text copies long runs of the prompt, and
the model's next tokens are then the ones that followed the same few tokens before.
Each sequence keeps an index per n-gram size (``n-gram -> the position after its latest
occurrence``) that grows with the tokens, so a step costs O(new tokens), not a scan of
the whole context.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from inference.engine.sequence import Sequence


class _Index:
    __slots__ = ("grams", "upto")

    def __init__(self, sizes: range) -> None:
        self.grams: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        self.upto = 0  # positions e < upto have their n-grams ending at e indexed


class NgramProposer:
    def __init__(self, k: int, n_min: int, n_max: int) -> None:
        self.k = k
        self.sizes = range(n_max, n_min - 1, -1)  # longest match first
        self._index: WeakKeyDictionary[Sequence, _Index] = WeakKeyDictionary()

    def propose(self, seq: Sequence, limit: int) -> list[int]:
        """Up to ``min(k, limit)`` tokens likely to follow ``seq.token_ids``; [] when its
        last tokens occur nowhere before."""
        limit = min(self.k, limit)
        if limit <= 0:
            return []
        tokens = seq.token_ids
        index = self._index.get(seq)
        if index is None:
            index = self._index[seq] = _Index(self.sizes)
        self._extend(index, tokens)
        end = len(tokens)
        for n in self.sizes:
            if n >= end:
                continue
            follow = index.grams[n].get(tuple(tokens[end - n :]))
            if follow is not None:
                return tokens[follow : follow + limit]
        return []

    @staticmethod
    def _extend(index: _Index, tokens: list[int]) -> None:
        """Index the n-grams ending before each position that now has a follower (the
        last token has none yet, so the current suffix never matches itself)."""
        last = len(tokens) - 1
        for e in range(index.upto, last + 1):
            for n, grams in index.grams.items():
                if e >= n:
                    grams[tuple(tokens[e - n : e])] = e
        index.upto = max(index.upto, last + 1)
