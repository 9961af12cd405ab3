"""Fixtures for the engine tests. The model fixtures live in model_fixtures.py
(tiny random-weight checkpoints and the real SmolLM2, ours beside HF's)."""

from tests.engine.engine_fixtures import tiny  # noqa: F401  (engine tests: a tiny model + its engines)
from tests.engine.model_fixtures import smollm2_pair, tiny_pair  # noqa: F401
