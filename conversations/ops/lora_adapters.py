"""LoRA adapters of the served models: ``ENGINE_LORA_MODULES`` loaded with each engine, and
the admin's loads and unloads at run time (``/v1/load_lora_adapter``). Each adapter becomes a
model id in ``served_models`` whose base is the model it was loaded on.

``ENGINE_LORA_MODULES="math=/adapters/math,chat=smol:/adapters/chat"``: an adapter on the
default model, or on the model named before a colon.
"""

from __future__ import annotations

import logging

from conversations.ops import engine_handle
from conversations.ops.model_settings import NAME
from conversations.ops.served_models import (
    AdapterEntry,
    adapter_entries,
    base_models,
    register_adapter,
    unregister_adapter,
)

log = logging.getLogger(__name__)


class AdapterError(ValueError):
    """An adapter that cannot be loaded or unloaded, with a message for the caller."""


def engine_key(base: str) -> str | None:
    """The engine registry's name of base model ``base`` (None: the shorthand's one model)."""
    return base if any(e.name for e in engine_handle.model_entries()) else None


def load_adapter(name: str, path: str, base: str | None) -> AdapterEntry:
    """Blocking (off the event loop): load ``path`` as adapter ``name`` on model ``base``
    (None: the default), replacing an adapter of that name. AdapterError says what is wrong."""
    if not NAME.match(name):
        raise AdapterError(f"lora_name {name!r}: use letters, digits and . _ : - (at most 64)")
    bases = {m.id for m in base_models()}
    if name in bases:
        raise AdapterError(f"lora_name {name!r} is the name of a served model")
    base = base or next(iter(bases))
    if base not in bases:
        raise AdapterError(f"base_model_name {base!r} is not a served model")
    engine = engine_handle.get_engine(engine_key(base))
    from inference.lora import LoraLoadError  # noqa: PLC0415 - the engine is loaded by now

    try:
        engine.load_adapter(name, path).result()
    except (LoraLoadError, ValueError, OSError) as exc:
        raise AdapterError(str(exc)) from None
    entry = AdapterEntry(name, base, path)
    register_adapter(entry)
    return entry


def unload_adapter(name: str) -> bool:
    """Blocking: stop serving adapter ``name``; False if no such adapter is served."""
    entry = next((a for a in adapter_entries() if a.name == name), None)
    if entry is None:
        return False
    engine = engine_handle.current_engine(engine_key(entry.base))
    if engine is not None:
        engine.unload_adapter(name).result()
    unregister_adapter(name)
    return True
