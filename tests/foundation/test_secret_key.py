"""With SECRET_KEY unset, a generated key is kept in the data directory, owner-only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from chatsite import secret_key

ROOT = Path(__file__).resolve().parents[2]


def test_a_generated_key_is_long_owner_only_and_reused(tmp_path):
    first = secret_key.load_or_create(tmp_path)
    path = tmp_path / secret_key.FILE_NAME
    assert len(first) >= 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret_key.load_or_create(tmp_path) == first


def test_a_key_file_readable_by_others_is_tightened(tmp_path):
    key = secret_key.load_or_create(tmp_path)
    path = tmp_path / secret_key.FILE_NAME
    os.chmod(path, 0o644)
    assert secret_key.load_or_create(tmp_path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.smoke
def test_settings_without_secret_key_use_the_stored_key_across_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    env.update(VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="chatsite.settings", PYTHONPATH=str(ROOT))
    code = "from django.conf import settings; print(settings.SECRET_KEY)"
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    keys = [r.stdout.strip() for r in runs]
    assert keys[0] == keys[1] == (tmp_path / secret_key.FILE_NAME).read_text()
    assert len(keys[0]) >= 50


def test_no_secret_key_is_committed_in_settings():
    source = (ROOT / "chatsite" / "settings.py").read_text()
    assert 'SECRET_KEY = "' not in source
