"""ENGINE_SPECULATIVE reaches the engine's settings, and a bad value stops the start with
one line naming the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import django, json; django.setup(); from django.conf import settings as s;"
    "print(json.dumps({k: s.ENGINE.get(k) for k in ('speculative', 'num_speculative_tokens')}))"
)


def probe(value: str | None) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "ENGINE_SPECULATIVE"}
    }
    env["DJANGO_SETTINGS_MODULE"] = "chatsite.settings"
    if value is not None:
        env["ENGINE_SPECULATIVE"] = value
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True)


def test_engine_speculative_is_off_by_default_and_parsed_when_set() -> None:
    unset = probe(None)
    assert unset.returncode == 0, unset.stderr
    assert json.loads(unset.stdout) == {"speculative": None, "num_speculative_tokens": None}
    ngram = probe("ngram:k=5")
    assert ngram.returncode == 0, ngram.stderr
    assert json.loads(ngram.stdout) == {"speculative": "ngram", "num_speculative_tokens": 5}
    bad = probe("medusa")
    assert bad.returncode != 0
    assert "ENGINE_SPECULATIVE" in bad.stderr
