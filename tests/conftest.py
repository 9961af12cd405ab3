"""Fixtures shared by the Django-side tests."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

ORIGIN = (b"origin", b"http://127.0.0.1")
FLUSH_ATTEMPTS = 3


@pytest.fixture(autouse=True, scope="session")
def _no_cluster_loop_in_the_test_runner():
    """The test runner is no server of the site: its in-process consumers must not advertise
    it to real server processes (a test's event loop dies with each test), nor fail over
    their answers. Daphne processes started by tests read the environment and do."""
    settings.CLUSTER_ADVERTISE = False


@pytest.fixture(autouse=True, scope="session")
def _quick_password_hashing():
    """Passwords hashed in the test process take 1,000 PBKDF2 rounds, not 1,000,000
    (``tests.support.hashers``). ``override_settings`` clears Django's cached hashers."""
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["tests.support.hashers.QuickPBKDF2PasswordHasher"]):
        yield


@pytest.fixture(autouse=True, scope="session")
def _flush_again_after_a_deadlock():
    """Site processes that a test module starts keep working on the database between its
    tests (each sweeps stale answers every few seconds), and the flush that empties the
    database after a transactional test can deadlock with one of their transactions.
    PostgreSQL then cancels one of the two; when it cancels the flush, flushing again empties
    the database."""
    from django.core.management.base import CommandError
    from django.test.testcases import TransactionTestCase

    original = TransactionTestCase._fixture_teardown

    def teardown(self) -> None:
        for attempt in range(FLUSH_ATTEMPTS):
            try:
                return original(self)
            except CommandError as exc:
                if attempt + 1 == FLUSH_ATTEMPTS or "deadlock detected" not in str(exc.__cause__):
                    raise
                time.sleep(0.2)

    TransactionTestCase._fixture_teardown = teardown
    yield
    TransactionTestCase._fixture_teardown = original


@pytest.fixture(autouse=True, scope="session")
def _flush_by_delete():
    """The flush after each transactional test deletes the rows instead of truncating the
    tables (``tests.support.fast_flush``): the same empty database, a fraction of the time."""
    from django.test import testcases

    from tests.support.fast_flush import deleting_flush

    original = testcases.call_command
    testcases.call_command = deleting_flush(original)
    yield
    testcases.call_command = original


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's, and before the test databases go, the lasting connection of the thread
    that runs in-process consumers' database calls (conversations.ops.db_thread) is closed:
    PostgreSQL drops no database a session is still connected to."""
    yield
    from conversations.ops.db_thread import close_thread_connections

    close_thread_connections()


@pytest.fixture
def make_user(db):
    def make(username: str = "alice", password: str = "a-long-unusual-passphrase-42"):
        return get_user_model().objects.create_user(username=username, password=password)

    return make


def session_cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def websocket(path: str, user=None, origin: tuple[bytes, bytes] | None = ORIGIN) -> WebsocketCommunicator:
    """A communicator on the real ASGI application, signed in as ``user`` when given."""
    from chatsite.asgi import application

    headers = [origin] if origin else []
    if user is not None:
        headers.append((b"cookie", session_cookie_for(user)))
    return WebsocketCommunicator(application, path, headers=headers)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random-weight Llama with SmolLM2's tokenizer and chat template: fast, real code paths."""
    from tests.support.fakes import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"), arch="llama")


@pytest.fixture(scope="session")
def live_site(django_db_setup, django_db_blocker, tiny_model_dir, tmp_path_factory):
    """Daphne in a subprocess on the test database; tests using it need ``transactional_db``."""
    from tests.live_site import start_live_site, stop_live_site

    site = start_live_site(tiny_model_dir, tmp_path_factory.mktemp("live-site"))
    yield site
    stop_live_site(site)


@pytest.fixture(scope="session")
def multi_model_site(django_db_setup, django_db_blocker, tiny_model_dir, tmp_path_factory):
    """Daphne serving two models (the tiny model as "smol", another random one as "tiny2")
    and two LoRA adapters built by peft ("ad8" of rank 8 on smol, "ad16" of rank 16 on
    tiny2, staff-only); tests using it need ``transactional_db``."""
    from tests.live_site import start_live_site, stop_live_site
    from tests.support.fakes import make_tiny_model_dir
    from tests.support.lora import make_peft_adapter

    root = tmp_path_factory.mktemp("multi-model")
    second = make_tiny_model_dir(root / "tiny2", arch="llama", seed=7)
    ad8 = make_peft_adapter(tiny_model_dir, root / "ad8", rank=8, seed=1)
    ad16 = make_peft_adapter(second, root / "ad16", rank=16, seed=2)
    site = start_live_site(
        tiny_model_dir,
        tmp_path_factory.mktemp("multi-model-logs"),
        ENGINE_MODELS=f"smol={tiny_model_dir},tiny2={second}",
        ENGINE_MODEL_KV_SHARES="smol=3,tiny2=1",
        ENGINE_KV_CACHE_GB="0.2",
        ENGINE_MODEL_DESCRIPTIONS="smol=Small and quick,tiny2=Another tiny model",
        ENGINE_LORA_MODULES=f"ad8={ad8},ad16=tiny2:{ad16}",
        ENGINE_STAFF_MODELS="ad16",
        TITLE_MODEL="tiny2",
    )
    site.paths = {"smol": tiny_model_dir, "tiny2": second, "ad8": ad8, "ad16": ad16, "root": root}
    yield site
    stop_live_site(site)


@pytest.fixture
def garbage() -> Iterator[list]:
    """What the next full garbage collection finds unreachable: reference cycles, which
    reference counting alone never frees (kept, not freed, for the test to look at)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
