"""The served models as settings: ``ENGINE_MODELS`` and the per-model settings beside it.

``ENGINE_MODELS="smol=/models/a.gguf,tiny=/models/b"`` serves several models in one process,
each under its name with its own engine and KV pool; ``ENGINE_MODEL=/path`` is the one-model
shorthand (served under the model's own name, as before). An empty path (``smol=``) is the
default SmolLM2 GGUF. The per-model settings are lists of ``name=value`` pairs too:

- ``ENGINE_MODEL_KV_GB="tiny=0.25"``: a model's KV pool in GiB. The others share what is left
  of ``ENGINE_KV_CACHE_GB`` in the proportions of ``ENGINE_MODEL_KV_SHARES="smol=3,tiny=1"``
  (equal shares when unset).
- ``ENGINE_MODEL_DESCRIPTIONS="smol=Small and quick"``: the picker's short description.
- ``ENGINE_STAFF_MODELS="tiny"``: models (and LoRA adapters) only staff may pick.
- ``ENGINE_MODELS_LOAD``: ``start`` (every model loads before the server listens) or
  ``first_use`` (the default: a model loads when first asked for), and
  ``ENGINE_MODEL_IDLE_UNLOAD_S`` (0: never) unloads a model unused that long.

Read by the settings at start; it imports nothing of the engine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
LOAD_MODES = ("first_use", "start")


@dataclass(frozen=True)
class ModelEntry:
    """One served model: ``name`` None only for the ``ENGINE_MODEL`` shorthand (the model's
    own name then)."""

    name: str | None
    path: str | None  # None: the default SmolLM2 GGUF
    kv_cache_gb: float
    description: str = ""
    staff_only: bool = False


def parse_pairs(raw: str, setting: str) -> dict[str, str]:
    """``a=1,b=2`` as a dict, in order; ValueError names the bad item."""
    pairs: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not NAME.match(name):
            raise ValueError(f"{setting}: expected name=value items, got {item.strip()!r}")
        if name in pairs:
            raise ValueError(f"{setting}: {name!r} is given twice")
        pairs[name] = value.strip()
    return pairs


def _number(value: str, setting: str, name: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{setting}: {name}={value!r} is not a number") from None
    if number <= 0:
        raise ValueError(f"{setting}: {name} must be more than 0, got {value}")
    return number


def parse_models(
    models: str,
    model: str,
    kv_cache_gb: float,
    *,
    kv_gb: str = "",
    kv_shares: str = "",
    descriptions: str = "",
    staff_models: str = "",
) -> list[ModelEntry]:
    """The served models, their KV budgets split as the docstring above says."""
    if not models.strip():
        return [ModelEntry(None, model or None, kv_cache_gb)]
    paths = parse_pairs(models, "ENGINE_MODELS")
    if not paths:
        raise ValueError("ENGINE_MODELS: names no model")
    fixed = {
        n: _number(v, "ENGINE_MODEL_KV_GB", n) for n, v in parse_pairs(kv_gb, "ENGINE_MODEL_KV_GB").items()
    }
    shares = {
        n: _number(v, "ENGINE_MODEL_KV_SHARES", n)
        for n, v in parse_pairs(kv_shares, "ENGINE_MODEL_KV_SHARES").items()
    }
    about = parse_pairs(descriptions, "ENGINE_MODEL_DESCRIPTIONS")
    staff = {n.strip() for n in staff_models.split(",") if n.strip()}
    for setting, names in (
        ("ENGINE_MODEL_KV_GB", fixed),
        ("ENGINE_MODEL_KV_SHARES", shares),
        ("ENGINE_MODEL_DESCRIPTIONS", about),
    ):
        unknown = sorted(set(names) - set(paths))
        if unknown:
            raise ValueError(f"{setting}: {', '.join(unknown)} is not in ENGINE_MODELS")
    shared = [n for n in paths if n not in fixed]
    left = kv_cache_gb - sum(fixed.values())
    if shared and left <= 0:
        raise ValueError(
            f"ENGINE_MODEL_KV_GB gives {sum(fixed.values()):g} GiB of the {kv_cache_gb:g} GiB of "
            f"ENGINE_KV_CACHE_GB: nothing is left for {', '.join(shared)}"
        )
    total_shares = sum(shares.get(n, 1.0) for n in shared)
    entries = []
    for name, path in paths.items():
        gb = fixed[name] if name in fixed else left * shares.get(name, 1.0) / total_shares
        entries.append(ModelEntry(name, path or None, gb, about.get(name, ""), name in staff))
    return entries


def weights_bytes(path: str | None) -> int:
    """The bytes of a model's weight files on disk (0 when they are not found: the load
    names that error)."""
    if path is None:
        return 0
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(f.stat().st_size for f in p.iterdir() if f.suffix in (".safetensors", ".bin", ".gguf"))
    return 0


def machine_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_fit(entries: list[ModelEntry], memory_gb: float) -> None:
    """ValueError, one line naming the first model that does not fit, when the weights and
    KV pools of the models, in the order given, exceed ``memory_gb`` (0: the machine's
    memory). Weights count at their size on disk (CPU: a GGUF's blocks stay as they are)."""
    budget = memory_gb * 2**30 if memory_gb > 0 else machine_memory_bytes()
    if budget <= 0:
        return
    used = 0.0
    for entry in entries:
        need = weights_bytes(entry.path) + entry.kv_cache_gb * 2**30
        if used + need > budget:
            label = entry.name or entry.path or "the model"
            raise ValueError(
                f"ENGINE_MODELS: model {label!r} does not fit: its weights and KV pool need "
                f"{need / 2**30:.2f} GiB and {max(0.0, budget - used) / 2**30:.2f} GiB of "
                f"{budget / 2**30:.2f} GiB (ENGINE_MEMORY_GB) are left"
            )
        used += need
