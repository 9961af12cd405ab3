"""Prefix-cache privacy through the API, against the live site with the official client.

A request's cached prefix is reused only within its user's namespace (their chat and API
calls), a body's ``cache_salt`` only within that namespace too; only the blocks made
wholly of a shared system prompt are common to every user. The probes are what an
attacker would measure: ``cached_tokens`` for someone else's text against a fresh text of
the same shape."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter

import httpx
import openai
import pytest

from conversations.models import ApiKey, Conversation
from inference.config import EngineConfig
from tests.api.conftest import wait_for_rows
from tests.conftest import session_cookie_for

pytestmark = pytest.mark.timeout(180)

BS = EngineConfig().block_size  # the live site's engine keeps the default
SYSTEM = "You are the site's assistant. " + " ".join(f"Rule {i}: answer with care." for i in range(6))


def cached_tokens(client, model: str, prompt: str, salt: str | None) -> int:
    extra = {"ignore_eos": True} | ({"cache_salt": salt} if salt else {})
    response = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body=extra)
    details = response.usage.prompt_tokens_details
    return details.cached_tokens if details else 0


def chat_cached_tokens(client, model: str, messages: list[dict], salt: str | None = None) -> int:
    extra = {"ignore_eos": True} | ({"cache_salt": salt} if salt else {})
    response = client.chat.completions.create(model=model, messages=messages, max_tokens=1, extra_body=extra)
    details = response.usage.prompt_tokens_details
    return details.cached_tokens if details else 0


# Texts of one test start with different words (different first letters, so different first
# tokens): two of them never share a block past their common template, whereas two random
# prefixes may share a token or two by chance, and with it one more block.
OPENINGS = "amber birch cobalt dune ember fjord grove heron indigo juniper kestrel lichen moss".split()


def private_text(opening: str, topic: str = "my landlord kept the deposit after I moved out") -> str:
    return f"{opening} {uuid.uuid4().hex} {topic} " * 4


def private_messages(opening: str, system: str = SYSTEM) -> list[dict]:
    """A system prompt (shared by design) and a long message only its writer knows."""
    text = private_text(opening)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def probe_like_an_attacker(client, model: str, secret: list[dict], make_fresh, salts) -> dict:
    """``cached_tokens`` for ``secret`` and for a fresh text of the same shape, with each
    salt, after warming each salt on that shape (the attacker's own prefix): an oracle
    shows as a difference."""
    for salt in salts:
        make_fresh(client, salt)
    return {salt: (make_fresh(client, salt), secret(client, salt)) for salt in salts}


@pytest.fixture
def client_for(live_site):
    clients: list[openai.OpenAI] = []
    answered: Counter = Counter()  # responses per user

    def make(user) -> openai.OpenAI:
        _key, raw = ApiKey.objects.create_key(user, name="cache-salt")

        def count(_response: httpx.Response) -> None:
            answered[user] += 1

        http = httpx.Client(timeout=60, event_hooks={"response": [count]})
        client = openai.OpenAI(base_url=f"{live_site.url}/v1", api_key=raw, max_retries=0, http_client=http)
        clients.append(client)
        return client

    yield make
    # The site writes each call's usage row after its response: let those land before the
    # test database is flushed, or the flush and a late insert can deadlock.
    for user, count in answered.items():
        wait_for_rows(user, count)
    for client in clients:
        client.close()


def chat_over_socket(live_site, user, messages: list[dict]) -> None:
    """``user`` sends ``messages[-1]`` in a new conversation with ``messages[0]`` as its system
    prompt, through the site's websocket, and waits for the answer."""
    import websockets

    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    conversation = Conversation.objects.create(
        owner=user, system_prompt=system, temperature=0.0, max_tokens=4
    )
    cookie = session_cookie_for(user).decode()

    async def talk() -> None:
        url = live_site.url.replace("http://", "ws://") + "/ws/chat/"
        headers = {"Cookie": cookie, "Origin": "http://127.0.0.1"}
        async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:

            async def until(kind: str) -> None:
                while True:
                    event = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    assert event["type"] != "error", event
                    if event["type"] == kind:
                        return

            await ws.send(json.dumps({"type": "open", "conversation_id": conversation.pk}))
            await until("thread")
            content = messages[-1]["content"]
            await ws.send(
                json.dumps({"type": "send", "conversation_id": conversation.pk, "content": content})
            )
            await until("finished")

    asyncio.run(talk())


def test_a_cached_prefix_is_shared_only_by_requests_with_the_same_salt(openai_client, model_name):
    # A fresh prompt per run: the live site's cache outlives single tests.
    prompt = f"{uuid.uuid4().hex} " + "the lighthouse keeper counted the waves " * 12
    assert cached_tokens(openai_client, model_name, prompt, "tenant-a") == 0
    assert cached_tokens(openai_client, model_name, prompt, "tenant-a") > 0
    assert cached_tokens(openai_client, model_name, prompt, "tenant-b") == 0
    assert cached_tokens(openai_client, model_name, prompt, None) == 0


def test_an_empty_cache_salt_is_a_400(openai_client, model_name):
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.completions.create(
            model=model_name, prompt="hi", max_tokens=1, extra_body={"cache_salt": ""}
        )
    assert raised.value.body["param"] == "cache_salt"


@pytest.mark.parametrize("system", [SYSTEM, ""], ids=["system-prompt", "no-system-prompt"])
def test_another_users_key_learns_nothing_of_a_users_chat_whatever_salt_it_sends(
    live_site, transactional_db, make_user, client_for, model_name, system
):
    alice, bob = make_user("alice-salt"), make_user("bob-salt")
    openings = iter(OPENINGS)
    secret = private_messages(next(openings), system)
    chat_over_socket(live_site, alice, secret)
    probes = probe_like_an_attacker(
        client_for(bob),
        model_name,
        lambda client, salt: chat_cached_tokens(client, model_name, secret, salt),
        lambda client, salt: chat_cached_tokens(
            client, model_name, private_messages(next(openings), system), salt
        ),
        (f"user:{alice.pk}", "anything", None),
    )
    for salt, (fresh, found) in probes.items():
        assert found == fresh, f"salt {salt!r}: {found} cached tokens against {fresh} for a fresh text"
    if system:  # the common system prompt is shared with everyone, salted or not
        assert probes[None][0] >= BS
    # Alice's own API call shares her chat's cache: the whole prompt hits.
    own = chat_cached_tokens(client_for(alice), model_name, secret)
    assert own > max(fresh for fresh, _ in probes.values()) + 2 * BS


def test_another_users_key_learns_nothing_of_a_users_api_calls_with_or_without_a_salt(
    live_site, transactional_db, make_user, client_for, model_name
):
    carol, bob = make_user("carol-salt"), make_user("bob-salt")
    carol_key, bob_key = client_for(carol), client_for(bob)
    openings, text_openings = iter(OPENINGS), iter(OPENINGS)  # chats and texts never share blocks
    secret = private_messages(next(openings))
    letter = "is my draft resignation letter to the board"
    text = private_text(next(text_openings), letter)
    salts = (None, f"user:{carol.pk}", "drafts")
    for salt in salts:
        chat_cached_tokens(carol_key, model_name, secret, salt)
        cached_tokens(carol_key, model_name, text, salt)
    chats = probe_like_an_attacker(
        bob_key,
        model_name,
        lambda client, salt: chat_cached_tokens(client, model_name, secret, salt),
        lambda client, salt: chat_cached_tokens(client, model_name, private_messages(next(openings)), salt),
        salts,
    )
    texts = probe_like_an_attacker(
        bob_key,
        model_name,
        lambda client, salt: cached_tokens(client, model_name, text, salt),
        lambda client, salt: cached_tokens(
            client, model_name, private_text(next(text_openings), letter), salt
        ),
        salts,
    )
    for salt in salts:
        assert chats[salt][1] == chats[salt][0] and texts[salt][1] == texts[salt][0], salt
    # Carol's own repeats hit, each within its own salt.
    for salt in salts:
        assert chat_cached_tokens(carol_key, model_name, secret, salt) > chats[salt][0] + 2 * BS
        assert cached_tokens(carol_key, model_name, text, salt) > texts[salt][0] + 2 * BS
