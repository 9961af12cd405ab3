"""The process's engine handle: once the engine is loaded, the long-lived heap is frozen, so
full garbage collections (on any thread, the event loop's included) stop walking it."""

from __future__ import annotations

import gc


def test_loading_the_engine_freezes_what_the_process_holds(tiny_model_dir, settings):
    from conversations.ops.engine_handle import get_engine, reset_engine_for_tests

    settings.ENGINE = {**settings.ENGINE, "model": str(tiny_model_dir), "kv_cache_gb": 0.05}
    reset_engine_for_tests()
    gc.unfreeze()
    try:
        engine = get_engine()
        assert gc.get_freeze_count() > 0
        assert all(obj is not engine for obj in gc.get_objects())  # frozen: out of every generation
    finally:
        reset_engine_for_tests()
