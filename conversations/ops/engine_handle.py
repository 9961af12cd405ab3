"""The one inference engine of this process, created lazily on first use.

Neither Daphne nor Django's ASGI handler has a lifespan hook, and AppConfig.ready()
also runs in migrate and Celery, so the engine is built on first use (or by an
explicit background preload) and shared by every consumer and API request.
"""

from __future__ import annotations

import atexit
import gc
import logging
import sys
import threading
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from inference import AsyncEngine

log = logging.getLogger(__name__)

_lock = threading.Lock()
_engine: AsyncEngine | None = None
_state = "not_loaded"  # not_loaded | loading | ready | error | stopped
_error: str | None = None


class EngineLoadError(RuntimeError):
    """The engine could not be built: the model did not load (a missing or unreadable
    ENGINE_MODEL, a broken install, a device that is not there). Names the setting to check."""


def _load_error(exc: Exception) -> EngineLoadError:
    setting = "ENGINE_LOADER" if settings.ENGINE_LOADER else "ENGINE_MODEL"
    cause = str(exc).splitlines()[0] if str(exc) else ""
    return EngineLoadError(
        f"the model could not be loaded ({type(exc).__name__}: {cause}); check {setting} "
        "and ENGINE_DEVICE, and that the install is complete (make clean && make run)"
    )


def get_engine(*, log_failure: bool = True) -> AsyncEngine:
    """Blocking: loads the model the first time. Call it off the event loop. A model that
    cannot load raises EngineLoadError (the next call tries again)."""
    global _engine, _state, _error
    with _lock:
        if _engine is not None:
            return _engine
        from inference import AsyncEngine, EngineConfig

        _state = "loading"
        try:
            config = EngineConfig(**{k: v for k, v in settings.ENGINE.items() if v is not None})
            loader = settings.ENGINE_LOADER
            if loader and config.prefill_workers:
                # A worker loads config.model itself: its KV would come from another model.
                raise ValueError(
                    "ENGINE_PREFILL_WORKERS needs the model of ENGINE_MODEL: prefill workers "
                    "cannot load an ENGINE_LOADER model"
                )
            interval = max(0.0, settings.ENGINE_STREAM_INTERVAL_MS) / 1000
            loaded = {"loaded": import_string(loader)()} if loader else {}
            _engine = AsyncEngine(config, stream_interval=interval, **loaded)
        except Exception as exc:
            error = _load_error(exc)
            _state, _error = "error", str(error)
            if log_failure:  # the traceback only for whoever debugs the install (LOG_LEVEL=DEBUG)
                log.error("engine failed to load: %s", error, exc_info=log.isEnabledFor(logging.DEBUG))
            raise error from exc
        freeze_long_lived_objects()  # before "ready": its one full collection is no request's pause
        _state, _error = "ready", None
        return _engine


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


async def aget_engine() -> AsyncEngine:
    if _engine is not None:
        return _engine
    return await sync_to_async(get_engine, thread_sensitive=False)()


def current_engine() -> AsyncEngine | None:
    """The engine if it is loaded, without loading it."""
    return _engine


def preload_engine_or_exit() -> None:
    """ENGINE_PRELOAD: the model loads before the server listens, so its first message never
    waits for it, and a model that cannot load stops the start with one line naming the cause
    and the setting to check (as a malformed setting does), instead of a site that answers
    503 for as long as it runs."""
    try:
        get_engine(log_failure=False)
    except EngineLoadError as exc:
        print(f"error: ENGINE_PRELOAD: {exc}", file=sys.stderr)
        sys.exit(1)


def engine_status() -> dict:
    status: dict = {"ready": _state == "ready", "state": _state}
    if _error:
        status["error"] = _error
    if _engine is not None:
        status["model"] = _engine.model_name
        status["stats"] = _engine.stats().as_dict()
    return status


def stop_engine(timeout: float) -> None:
    """At shutdown, off the event loop (it joins the engine thread): the engine thread ends
    its step and fails the requests left, so the interpreter never exits in the middle of a
    step. Not ready any more: nothing new is sent to it."""
    global _state
    engine = _engine
    if engine is not None:
        _state = "stopped"
        engine.shutdown(timeout)


def reset_engine_for_tests() -> None:
    """Shut the engine down so the next get_engine() builds one from current settings."""
    global _engine, _state, _error
    with _lock:
        if _engine is not None:
            _engine.shutdown()
        _engine, _state, _error = None, "not_loaded", None
