"""vLLM's cache_salt through the API: a prompt's cached prefix is reused only by
requests with the same salt."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.timeout(120)


def cached_tokens(client, model: str, prompt: str, salt: str | None) -> int:
    extra = {"ignore_eos": True} | ({"cache_salt": salt} if salt else {})
    response = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body=extra)
    details = response.usage.prompt_tokens_details
    return details.cached_tokens if details else 0


def test_a_cached_prefix_is_shared_only_by_requests_with_the_same_salt(openai_client, model_name):
    # A fresh prompt per run: the live site's cache outlives single tests.
    prompt = f"{uuid.uuid4().hex} " + "the lighthouse keeper counted the waves " * 12
    assert cached_tokens(openai_client, model_name, prompt, "tenant-a") == 0
    assert cached_tokens(openai_client, model_name, prompt, "tenant-a") > 0
    assert cached_tokens(openai_client, model_name, prompt, "tenant-b") == 0
    assert cached_tokens(openai_client, model_name, prompt, None) == 0


def test_an_empty_cache_salt_is_a_400(openai_client, model_name):
    import openai

    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.completions.create(
            model=model_name, prompt="hi", max_tokens=1, extra_body={"cache_salt": ""}
        )
    assert raised.value.body["param"] == "cache_salt"
