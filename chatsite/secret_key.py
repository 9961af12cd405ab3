"""A generated SECRET_KEY, kept in the data directory so sessions survive restarts.

Used only when ``SECRET_KEY`` is unset. The file is created with mode 0600 in one
``open(O_CREAT | O_EXCL)``, so processes starting together agree on one key, and no
other user can read it (sessions and password-reset links are signed with it).
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from chatsite.env import ConfigError

FILE_NAME = "secret_key"
KEY_BYTES = 48  # token_urlsafe(48) is 64 characters


def load_or_create(directory: Path) -> str:
    path = directory / FILE_NAME
    directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read(path)
    key = secrets.token_urlsafe(KEY_BYTES)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key)
    return key


def _read(path: Path) -> str:
    if path.stat().st_mode & 0o077:
        # Someone loosened it: tighten rather than keep serving a key others may read.
        os.chmod(path, 0o600)
    # Another process may have created the file a moment ago and not written it yet.
    for _ in range(50):
        key = path.read_text(encoding="ascii").strip()
        if key:
            break
        time.sleep(0.02)
    if len(key) < 50:
        raise ConfigError(f"SECRET_KEY: {path} holds no usable key; delete it to generate a new one")
    return key
