"""What a user may ask for by name: every served model and LoRA adapter, as model ids.

The one catalogue behind ``/v1/models``, the API's ``model`` field and the chat's picker.
A model id is a served model's name (``ENGINE_MODELS``) or an adapter's
(``ENGINE_LORA_MODULES``, ``/v1/load_lora_adapter``); an adapter runs on its base model's
engine. Access: a model or adapter named in ``ENGINE_STAFF_MODELS`` is staff-only; to
everyone else it does not exist (a 404, as an unknown name: its existence is not shown).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from django.conf import settings

from conversations.ops import engine_handle


@dataclass(frozen=True)
class ServedModel:
    """One model id. ``base``: the engine's model name (the id itself for a base model);
    ``adapter``: the LoRA adapter's name on that base, or None."""

    id: str
    base: str
    adapter: str | None = None
    description: str = ""
    staff_only: bool = False
    root: str = ""  # vLLM's: the weights' path (the adapter's for an adapter)
    parent: str | None = None  # vLLM's: an adapter's base model id

    def allowed(self, is_staff: bool) -> bool:
        return is_staff or not self.staff_only


@dataclass(frozen=True)
class AdapterEntry:
    name: str
    base: str  # the base model's id
    path: str


_adapters_lock = threading.Lock()
_adapters: dict[str, AdapterEntry] = {}
_unloaded: set[str] = set()  # configured adapters an admin unloaded


def register_adapter(entry: AdapterEntry) -> None:
    with _adapters_lock:
        _adapters[entry.name] = entry
        _unloaded.discard(entry.name)


def unregister_adapter(name: str) -> AdapterEntry | None:
    with _adapters_lock:
        _unloaded.add(name)
        return _adapters.pop(name, None)


def adapter_entries() -> list[AdapterEntry]:
    """The configured adapters (listed before their model loads; they load with it), then
    those an admin loaded, each name once (a later load of a name replaces it)."""
    default = None
    entries: dict[str, AdapterEntry] = {}
    for name, base, path in engine_handle.configured_adapters():
        if name in _unloaded:
            continue
        if base is None:
            default = default or base_models()[0].id
        entries[name] = AdapterEntry(name, base or default or "", path)
    with _adapters_lock:
        entries.update(_adapters)
    return list(entries.values())


def _staff_names() -> set[str]:
    return {n.strip() for n in settings.ENGINE_STAFF_MODELS.split(",") if n.strip()}


def base_models() -> list[ServedModel]:
    """The served base models, the default first. The ``ENGINE_MODEL`` shorthand's model is
    named once its engine is loaded (its own name), so listing it loads it."""
    staff = _staff_names()
    models = []
    for entry, name in zip(engine_handle.model_entries(), engine_handle.model_names(), strict=True):
        if not name:
            name = engine_handle.get_engine(None).model_name
        models.append(
            ServedModel(
                name,
                name,
                description=entry.description,
                staff_only=entry.staff_only or name in staff,
                root=entry.path or "",
            )
        )
    return models


def served_models(is_staff: bool = True) -> list[ServedModel]:
    """Every model id ``is_staff`` may use: the base models, then the adapters. Blocking
    the first time for the shorthand's model (see ``base_models``)."""
    bases = base_models()
    staff = _staff_names()
    known = {m.id for m in bases}
    adapters = [
        ServedModel(a.name, a.base, a.name, staff_only=a.name in staff, root=a.path, parent=a.base)
        for a in adapter_entries()
        if a.base in known
    ]
    return [m for m in [*bases, *adapters] if m.allowed(is_staff)]


def find_model(model_id: str, is_staff: bool) -> ServedModel | None:
    """The model id ``model_id`` as ``is_staff`` may see it, or None (unknown or not theirs)."""
    for model in served_models(is_staff):
        if model.id == model_id:
            return model
    return None


def default_model_id(is_staff: bool = True) -> str:
    models = served_models(is_staff)
    return models[0].id if models else ""


def title_model_id() -> str | None:
    """The model that writes titles: TITLE_MODEL, or None (the default model)."""
    return settings.TITLE_MODEL or None
