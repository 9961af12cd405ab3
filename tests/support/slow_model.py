"""An ``ENGINE_LOADER`` for server processes that tests need busy: the model of
``ENGINE_MODEL`` (the tiny random one), each forward pass held back by
``SLOW_MODEL_STEP_SECONDS``, so an answer or a title is still being written when the
test acts on the server."""

from __future__ import annotations

import os
import time
from typing import Any


def slow_tiny_model() -> tuple[Any, Any, Any]:
    from django.conf import settings

    from inference.runner.model_loader import load_model

    model, tokenizer, config = load_model(settings.ENGINE["model"], "cpu")
    delay = float(os.environ.get("SLOW_MODEL_STEP_SECONDS", "0.05"))
    forward = model.forward

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        time.sleep(delay)
        return forward(*args, **kwargs)

    model.forward = slow_forward  # nn.Module.__call__ looks it up on the instance
    return model, tokenizer, config
