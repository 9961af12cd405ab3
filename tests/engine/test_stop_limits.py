"""Stop strings are capped (count and length, a clear error) and the hold-back check that
runs for every delta on the engine thread is linear in a stop string's length."""

from __future__ import annotations

import random
import time

import pytest

from inference.sampling.params import MAX_STOP_CHARS, MAX_STOP_STRINGS, SamplingParams
from inference.sampling.stop_rules import held_back


def brute_force_held_back(text: str, stops: list[str]) -> int:
    """The definition: the longest proper prefix of any stop string that ``text`` ends with."""
    best = 0
    for stop in stops:
        for k in range(1, min(len(stop) - 1, len(text)) + 1):
            if text.endswith(stop[:k]):
                best = max(best, k)
    return best


def test_stop_string_count_and_length_are_capped_with_clear_errors() -> None:
    SamplingParams(stop=["x"] * MAX_STOP_STRINGS)
    SamplingParams(stop=["x" * MAX_STOP_CHARS])
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_STRINGS} strings, got {MAX_STOP_STRINGS + 1}"):
        SamplingParams(stop=[f"s{i}" for i in range(MAX_STOP_STRINGS + 1)])
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_CHARS} characters long") as caught:
        SamplingParams(stop=["y" * 60_000])
    assert len(str(caught.value)) < 200  # the message names the limit, it does not echo the input


def test_held_back_matches_the_definition_on_random_texts() -> None:
    rnd = random.Random(7)
    for _ in range(5000):
        text = "".join(rnd.choice("ab") for _ in range(rnd.randint(0, 14)))
        stops = [
            "".join(rnd.choice("abc") for _ in range(rnd.randint(1, 8))) for _ in range(rnd.randint(1, 4))
        ]
        assert held_back(text, stops) == brute_force_held_back(text, stops), (text, stops)


def _best_time(text: str, stops: list[str]) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        held_back(text, stops)
        best = min(best, time.perf_counter() - started)
    return best


def test_held_back_grows_linearly_with_the_stop_strings_length() -> None:
    """A stop string whose first character ends the text but nothing more matches: slicing
    a prefix for every overlap length costs the square of its length. Eight times the
    length must cost about sixteen times the time (a baseline in the same run, not a clock
    limit): the quadratic check took about 75 times."""

    def case(n: int) -> tuple[str, list[str]]:
        return "x" * (2 * n) + "a", ["a" + "y" * n]

    small, large = 4_000, 64_000
    ratio = _best_time(*case(large)) / _best_time(*case(small))
    assert ratio < 40, f"16x the stop length cost {ratio:.1f}x the time"


def test_the_api_schema_caps_stop_strings_as_the_engine_does():
    from conversations.api import schemas

    assert (schemas.MAX_STOP, schemas.MAX_STOP_CHARS) == (MAX_STOP_STRINGS, MAX_STOP_CHARS)
