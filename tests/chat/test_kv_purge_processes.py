"""A user's KV blocks leave the engine of another process: housekeeping (here, the test
runner: another process, as a Celery worker is) purges a deleted conversation, and the
site process, reached through the registry and its channel, drops the owner's blocks from
its pool and its disk tier. Needs PostgreSQL and Redis, as every multi-process test."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from datetime import timedelta

import openai
import pytest
from django.utils import timezone

from conversations.chat import housekeeping
from conversations.models import ApiKey, Conversation
from inference.kv.disk_files import namespace_dir
from inference.kv.salt import salt_hash
from tests.conftest import session_cookie_for
from tests.live_site import health_details

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="needs DATABASE_URL and REDIS_URL: several processes share PostgreSQL and Redis",
    ),
]


def stats(site) -> dict:
    return health_details(site.url)["engine"]["stats"]


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def open_conversation(site, user, conversation) -> None:
    """A tab opens the conversation: the site process starts serving its process channel."""
    import websockets

    headers = {"Cookie": session_cookie_for(user).decode(), "Origin": "http://127.0.0.1"}

    async def talk() -> None:
        url = site.url.replace("http://", "ws://") + "/ws/chat/"
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "open", "conversation_id": conversation.pk}))
            while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] != "thread":
                pass

    asyncio.run(talk())


@pytest.fixture
def site_with_disk(tiny_model_dir, tmp_path, settings):
    from tests.live_site import start_live_site, stop_live_site

    prefix = f"test-purge-{uuid.uuid4().hex[:8]}"
    settings.CLUSTER_PREFIX = prefix  # this process reads the site's registry
    disk = tmp_path / "kv"
    site = start_live_site(tiny_model_dir, tmp_path, CLUSTER_PREFIX=prefix, ENGINE_KV_DISK_DIR=str(disk))
    yield site, disk, prefix
    stop_live_site(site)


def test_a_purge_in_another_process_drops_the_owners_blocks_from_the_site_process(
    site_with_disk, make_user, settings
):
    import redis

    site, disk, prefix = site_with_disk
    settings.PREFIX_CACHE_SALT = True
    alice = make_user("alice-purge")
    conversation = Conversation.objects.create(owner=alice)
    open_conversation(site, alice, conversation)
    registry = redis.Redis.from_url(os.environ["REDIS_URL"])
    wait_for(lambda: registry.keys(f"{prefix}:proc:*"), "the site never advertised itself")

    _key, raw = ApiKey.objects.create_key(alice, name="purge")
    client = openai.OpenAI(base_url=f"{site.url}/v1", api_key=raw, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": f"{uuid.uuid4().hex} my tenancy dispute, in detail " * 6}]

    def cached() -> int:
        response = client.chat.completions.create(model=stats_model(site), messages=messages, max_tokens=1)
        return response.usage.prompt_tokens_details.cached_tokens

    assert cached() == 0
    assert cached() > 32
    folder = namespace_dir(disk, salt_hash(f"user:{alice.pk}"))
    wait_for(lambda: list(folder.glob("*.kv")), "the blocks were never written to the disk tier")
    assert stats(site)["kv_blocks_cached"] > 0

    Conversation.objects.filter(pk=conversation.pk).update(deleted_at=timezone.now() - timedelta(days=31))
    assert housekeeping.purge_deleted_conversations() == 1  # autocommit: the purge goes out now
    wait_for(lambda: stats(site)["kv_blocks_cached"] == 0, "the site process kept the blocks")
    assert not folder.exists()
    assert cached() == 0
    client.close()


def stats_model(site) -> str:
    return health_details(site.url)["engine"]["model"]
