"""The inference engines of this process: one per served model, each created lazily.

Neither Daphne nor Django's ASGI handler has a lifespan hook, and AppConfig.ready()
also runs in migrate and Celery, so an engine is built on first use (or by an explicit
background preload) and shared by every consumer and API request.

``settings.ENGINE_MODEL_LIST`` (``conversations.ops.model_settings``) names the models: each gets
its own engine and KV pool, built from ``settings.ENGINE`` with its path, served name and
share of the KV budget. The first is the default (``model=None``). With
``ENGINE_MODEL_IDLE_UNLOAD_S`` a model nobody used for that long, and that runs nothing,
is unloaded, and loads again when next asked for.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils.module_loading import import_string

from conversations.ops.model_settings import ModelEntry, parse_pairs

if TYPE_CHECKING:
    from inference import AsyncEngine

log = logging.getLogger(__name__)


class EngineLoadError(RuntimeError):
    """The engine could not be built: the model did not load (a missing or unreadable
    ENGINE_MODEL, a broken install, a device that is not there). Names the setting to check."""


class UnknownModelError(LookupError):
    """No served model has that name."""


@dataclass
class _Slot:
    """One served model and its engine (None until loaded)."""

    entry: ModelEntry
    lock: threading.Lock = field(default_factory=threading.Lock)
    engine: AsyncEngine | None = None
    state: str = "not_loaded"  # not_loaded | loading | ready | error | stopped
    error: str | None = None
    last_used: float = 0.0

    @property
    def setting(self) -> str:
        return "ENGINE_MODELS" if self.entry.name else "ENGINE_MODEL"


_slots_lock = threading.Lock()
_slots: dict[str, _Slot] | None = None  # by served name ("" for the ENGINE_MODEL shorthand)
_reaper: threading.Thread | None = None


def _all_slots() -> dict[str, _Slot]:
    global _slots
    with _slots_lock:
        if _slots is None:
            _slots = {(e.name or ""): _Slot(e) for e in settings.ENGINE_MODEL_LIST}
        return _slots


def slot_for(model: str | None) -> _Slot:
    """The slot serving ``model`` (None: the default). The shorthand's one model answers to
    its own name only once loaded, so any name reaches it and the caller compares."""
    slots = _all_slots()
    if model is None or "" in slots:
        return next(iter(slots.values()))
    try:
        return slots[model]
    except KeyError:
        raise UnknownModelError(model) from None


def model_names() -> list[str]:
    """The served models' names, default first ("" for the shorthand's unloaded model)."""
    return [
        slot.entry.name or (slot.engine.model_name if slot.engine else "") for slot in _all_slots().values()
    ]


def model_entries() -> list[ModelEntry]:
    return [slot.entry for slot in _all_slots().values()]


def configured_adapters() -> list[tuple[str, str | None, str]]:
    """(adapter, base model name or None for the default, path) from ENGINE_LORA_MODULES:
    ``name=/path`` on the default model, ``name=base:/path`` on model ``base``."""
    models = {e.name for e in model_entries() if e.name}
    modules = []
    for name, value in parse_pairs(settings.ENGINE_LORA_MODULES, "ENGINE_LORA_MODULES").items():
        base, sep, path = value.partition(":")
        modules.append((name, base, path) if sep and base in models else (name, None, value))
    return modules


def load_configured_adapters(engine: AsyncEngine, model: str | None) -> None:
    """With each new engine, blocking: the ENGINE_LORA_MODULES adapters of its model."""
    default = model_entries()[0].name
    for name, base, path in configured_adapters():
        if (base or default) == (model or default):
            engine.load_adapter(name, path).result()
            log.info("engine %s: LoRA adapter %s loaded from %s", engine.model_name, name, path)


def _load_error(exc: Exception, setting: str) -> EngineLoadError:
    setting = "ENGINE_LOADER" if settings.ENGINE_LOADER else setting
    if "adapter" in str(exc).lower() or "lora" in type(exc).__name__.lower():
        setting = "ENGINE_LORA_MODULES"
    cause = str(exc).splitlines()[0] if str(exc) else ""
    return EngineLoadError(
        f"the model could not be loaded ({type(exc).__name__}: {cause}); check {setting} "
        "and ENGINE_DEVICE, and that the install is complete (make clean && make run)"
    )


def _engine_options(entry: ModelEntry) -> dict:
    """EngineConfig keywords of one model: the shared ENGINE settings, its own path, name,
    KV share and (several models) its own disk-tier directory."""
    options = {k: v for k, v in settings.ENGINE.items() if v is not None}
    options.setdefault("max_loras", settings.ENGINE_MAX_LORAS)
    if entry.name is None:
        return options  # the shorthand: settings.ENGINE as it stands (tests change it)
    options.update(served_name=entry.name, kv_cache_gb=entry.kv_cache_gb)
    options.pop("model", None)
    if entry.path:
        options["model"] = entry.path
    if options.get("kv_disk_dir"):
        options["kv_disk_dir"] = os.path.join(options["kv_disk_dir"], entry.name)
    return options


def get_engine(model: str | None = None, *, log_failure: bool = True) -> AsyncEngine:
    """Blocking: loads the model the first time. Call it off the event loop. A model that
    cannot load raises EngineLoadError (the next call tries again); an unknown name
    UnknownModelError."""
    slot = slot_for(model)
    with slot.lock:
        slot.last_used = time.monotonic()
        if slot.engine is not None:
            return slot.engine
        from inference import AsyncEngine, EngineConfig

        slot.state = "loading"
        try:
            config = EngineConfig(**_engine_options(slot.entry))
            loader = settings.ENGINE_LOADER
            if loader and config.prefill_workers:
                # A worker loads config.model itself: its KV would come from another model.
                raise ValueError(
                    "ENGINE_PREFILL_WORKERS needs the model of ENGINE_MODEL: prefill workers "
                    "cannot load an ENGINE_LOADER model"
                )
            interval = max(0.0, settings.ENGINE_STREAM_INTERVAL_MS) / 1000
            # ENGINE_LOADER (tests) stands in for the one-model shorthand's ENGINE_MODEL.
            loaded = {"loaded": import_string(loader)()} if loader and slot.entry.name is None else {}
            engine = AsyncEngine(config, stream_interval=interval, **loaded)
            try:
                load_configured_adapters(engine, slot.entry.name)
            except Exception:
                engine.shutdown()
                raise
        except Exception as exc:
            error = _load_error(exc, slot.setting)
            slot.state, slot.error = "error", str(error)
            if log_failure:  # the traceback only for whoever debugs the install (LOG_LEVEL=DEBUG)
                log.error("engine failed to load: %s", error, exc_info=log.isEnabledFor(logging.DEBUG))
            raise error from exc
        freeze_long_lived_objects()  # before "ready": its one full collection is no request's pause
        slot.engine, slot.state, slot.error = engine, "ready", None
        _start_reaper()
        return engine


def freeze_long_lived_objects() -> None:
    """Once the engine is loaded, what the process holds (Django, the model's modules, the
    tokenizer: millions of objects) lives as long as it does. Frozen, a full collection no
    longer walks them: unfrozen, each took hundreds of milliseconds on whichever thread
    triggered it, the event loop included, stalling every stream."""
    gc.collect()
    gc.freeze()
    # Back in the collector's sight for the interpreter's last collection (native
    # extensions report what is left uncollected then).
    atexit.unregister(gc.unfreeze)  # once, however often the engine is rebuilt (tests)
    atexit.register(gc.unfreeze)


async def aget_engine(model: str | None = None) -> AsyncEngine:
    slot = slot_for(model)
    if slot.engine is not None:
        slot.last_used = time.monotonic()
        return slot.engine
    return await sync_to_async(get_engine, thread_sensitive=False)(model)


def current_engine(model: str | None = None) -> AsyncEngine | None:
    """The engine if it is loaded, without loading it."""
    return slot_for(model).engine


def loaded_engines() -> list[AsyncEngine]:
    """Every engine loaded now (purges and idle work reach each model)."""
    return [slot.engine for slot in _all_slots().values() if slot.engine is not None]


def preload_engine_or_exit() -> None:
    """ENGINE_PRELOAD (or ENGINE_MODELS_LOAD=start): the models load before the server
    listens, so no first message waits for one, and a model that cannot load stops the
    start with one line naming the cause and the setting to check (as a malformed setting
    does), instead of a site that answers 503 for as long as it runs."""
    names = [e.name for e in model_entries()]
    if not (settings.ENGINE_PRELOAD or settings.ENGINE_MODELS_LOAD == "start"):
        names = names[:0]
    elif not settings.ENGINE_MODELS_LOAD == "start":
        names = names[:1]  # ENGINE_PRELOAD alone: the default model
    for name in names:
        try:
            engine = get_engine(name, log_failure=False)
        except EngineLoadError as exc:
            label = f"model {name!r}: " if name else ""
            print(f"error: ENGINE_PRELOAD: {label}{exc}", file=sys.stderr)
            sys.exit(1)
        # xgrammar's tokenizer data (seconds of CPU, much of it holding the GIL) and a compile
        # worker's start, now, before any stream, rather than at the first grammar.
        threading.Thread(
            target=_prepare_grammars, args=(engine,), name="grammar-prepare", daemon=True
        ).start()


def _prepare_grammars(engine: AsyncEngine) -> None:
    try:
        engine.grammars.prepare()
    except Exception:  # the first grammar tries again, and reports
        log.warning("preparing grammar compiles failed", exc_info=True)


def _status_of(slot: _Slot) -> dict:
    status: dict = {"ready": slot.state == "ready", "state": slot.state}
    if slot.error:
        status["error"] = slot.error
    if slot.engine is not None:
        status["model"] = slot.engine.model_name
        status["stats"] = slot.engine.stats().as_dict()
    elif slot.entry.name:
        status["model"] = slot.entry.name
    return status


def engine_status(model: str | None = None) -> dict:
    """The default model's status (or ``model``'s); with several models, ``models`` lists
    each one's too. A model that loads on first use and is not loaded yet is not an error:
    the site is ready when the default model is, or could load."""
    status = _status_of(slot_for(model))
    slots = _all_slots()
    if len(slots) > 1:
        status["models"] = [_status_of(s) for s in slots.values()]
    return status


def _unload(slot: _Slot) -> None:
    with slot.lock:
        engine, slot.engine = slot.engine, None
        slot.state = "not_loaded"
    if engine is not None:
        engine.shutdown()
        log.info(
            "engine: unloaded model %s after %.0f s unused",
            slot.entry.name,
            settings.ENGINE_MODEL_IDLE_UNLOAD_S,
        )


def unload_idle(now: float | None = None) -> list[str]:
    """Unload every model unused for ENGINE_MODEL_IDLE_UNLOAD_S that runs nothing; the names
    unloaded. The default model stays (titles, embeddings and health checks lean on it)."""
    limit = settings.ENGINE_MODEL_IDLE_UNLOAD_S
    now = time.monotonic() if now is None else now
    unloaded = []
    for slot in list(_all_slots().values())[1:]:
        engine = slot.engine
        if limit <= 0 or engine is None or now - slot.last_used < limit:
            continue
        stats = engine.stats()
        if stats.running or stats.waiting:
            continue
        _unload(slot)
        unloaded.append(slot.entry.name or "")
    return unloaded


def _start_reaper() -> None:
    global _reaper
    limit = settings.ENGINE_MODEL_IDLE_UNLOAD_S
    if limit <= 0 or len(_all_slots()) < 2 or (_reaper is not None and _reaper.is_alive()):
        return

    def reap() -> None:
        while _slots is not None:
            time.sleep(max(0.5, min(limit / 4, 10.0)))
            try:
                unload_idle()
            except Exception:  # never let the reaper die silently: the next round tries again
                log.exception("idle unload failed")

    _reaper = threading.Thread(target=reap, name="engine-idle-unload", daemon=True)
    _reaper.start()


def stop_engine(timeout: float) -> None:
    """At shutdown, off the event loop (it joins the engine threads): each engine thread ends
    its step and fails the requests left, so the interpreter never exits in the middle of a
    step. Not ready any more: nothing new is sent to them."""
    for slot in _all_slots().values():
        if slot.engine is not None:
            slot.state = "stopped"
            slot.engine.shutdown(timeout)


def reset_engine_for_tests() -> None:
    """Shut the engines down so the next get_engine() builds them from current settings."""
    global _slots
    with _slots_lock:
        slots, _slots = _slots, None
    for slot in (slots or {}).values():
        with slot.lock:
            if slot.engine is not None:
                slot.engine.shutdown()
            slot.engine = None
