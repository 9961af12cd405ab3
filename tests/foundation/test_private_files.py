"""Private data is the owner's alone, whatever the umask: the data directory is 0700, the
SQLite database and its WAL and shared-memory files 0600; a directory another user owns or
may write to is refused (the check the kernels' build cache and the KV disk tier share)."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from chatsite_kernels.private_paths import UnsafePathError, ensure_private_dir, open_private_file
from conversations.ops import files

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022():
    """The usual umask, under which files are born readable by everyone."""
    old = os.umask(0o022)
    yield
    os.umask(old)


# A real server's start: settings (with VAR_DIR), then a write through Django's connection.
# The modes are read while the connection is open, when the -wal and -shm files exist.
WRITE_AND_STAT = """
import json, os, stat
os.umask(0o022)
import django
django.setup()
from django.conf import settings
from django.db import connection
with connection.cursor() as c:
    c.execute("CREATE TABLE IF NOT EXISTS t (x TEXT)")
    c.execute("INSERT INTO t VALUES ('private')")
name = settings.DATABASES["default"]["NAME"]
print(json.dumps({
    suffix: stat.S_IMODE(os.stat(name + suffix).st_mode) if os.path.exists(name + suffix) else None
    for suffix in ("", "-wal", "-shm")
} | {"var": stat.S_IMODE(os.stat(settings.VAR_DIR).st_mode)}))
"""


def start_site(var_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SQLITE_PATH", "REDIS_URL"}}
    env.update(VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="chatsite.settings", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", WRITE_AND_STAT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.smoke
def test_the_data_directory_is_0700_and_the_database_with_its_wal_and_shm_0600_after_a_write(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    os.chmod(var, 0o755)  # as an earlier version left it
    result = start_site(var)
    assert result.returncode == 0, result.stderr[-2000:]
    modes = json.loads(result.stdout.strip().splitlines()[-1])
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600, "var": 0o700}


def test_a_database_an_earlier_version_left_readable_is_tightened_with_its_wal(tmp_path, umask_022):
    var = tmp_path / "var"
    var.mkdir()
    db = sqlite3.connect(var / "db.sqlite3")  # born 0644 under umask 022, WAL and all
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE old (x)")
    db.commit()
    assert mode(var / "db.sqlite3") == 0o644 and mode(f"{var / 'db.sqlite3'}-wal") == 0o644
    result = start_site(var)
    db.close()
    assert result.returncode == 0, result.stderr[-2000:]
    modes = json.loads(result.stdout.strip().splitlines()[-1])
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600, "var": 0o700}


def test_a_data_directory_others_can_write_to_stops_the_server_with_one_line(tmp_path):
    var = tmp_path / "shared"
    var.mkdir()
    os.chmod(var, 0o777)
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.update(VAR_DIR=str(var))
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "VAR_DIR" in lines[0] and "writable by other users" in lines[0]
    assert not list(var.iterdir())  # no database, no secret key written there


@pytest.mark.django_db
def test_a_database_django_creates_itself_is_tightened_when_its_connection_opens(tmp_path, umask_022):
    """Django's test databases are created by SQLite on connect, not by settings: the
    ``connection_created`` receiver makes them and their WAL private."""
    from django.db.utils import ConnectionHandler

    name = tmp_path / "made-by-django.sqlite3"
    handler = ConnectionHandler({"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(name)}})
    connection = handler["default"]  # a handler of its own: not the test run's database
    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("CREATE TABLE t (x)")
            cursor.execute("INSERT INTO t VALUES (1)")
            assert mode(name) == 0o600 and mode(f"{name}-wal") == 0o600 and mode(f"{name}-shm") == 0o600
    finally:
        connection.close()


# ---- the shared check --------------------------------------------------------------------


@pytest.mark.parametrize("loose", [0o777, 0o770, 0o702])
def test_a_directory_writable_by_group_or_others_is_refused(tmp_path, loose):
    target = tmp_path / "dir"
    target.mkdir()
    os.chmod(target, loose)
    with pytest.raises(UnsafePathError, match="writable by other users"):
        ensure_private_dir(target)
    with pytest.raises(UnsafePathError):
        files.prepare_data_dir(target)
    assert mode(target) == loose  # refused, not "repaired": files may already have been planted


def test_a_directory_owned_by_another_user_is_refused(tmp_path):
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(target, NOBODY, NOBODY)
    else:
        target = Path("/usr")  # root's
    with pytest.raises(UnsafePathError, match="belongs to another user"):
        ensure_private_dir(target)


def test_a_directory_only_readable_by_others_is_tightened_and_a_missing_one_created_0700(tmp_path, umask_022):
    readable = tmp_path / "readable"
    readable.mkdir()
    os.chmod(readable, 0o755)
    ensure_private_dir(readable)
    assert mode(readable) == 0o700
    created = ensure_private_dir(tmp_path / "a" / "b")
    assert mode(created) == 0o700
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o755)
    ensure_private_dir(cache, tighten=False)  # the kernels' build cache: readable is fine
    assert mode(cache) == 0o755


def test_private_files_are_0600_new_or_left_readable(tmp_path, umask_022):
    new = tmp_path / "new"
    os.close(open_private_file(new))
    assert mode(new) == 0o600
    old = tmp_path / "old"
    old.write_text("x")
    assert mode(old) == 0o644
    os.close(open_private_file(old, os.O_RDWR | os.O_CREAT))
    assert mode(old) == 0o600 and old.read_text() == "x"
