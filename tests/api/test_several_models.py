"""One process serving two models and two LoRA adapters: /v1/models with the official
openai client, the ``model`` field choosing one, unknown and staff-only models as OpenAI's
404, and an admin's run-time adapter loads."""

from __future__ import annotations

import time

import openai
import pytest

from conversations.models import ApiKey

pytestmark = pytest.mark.timeout(180)
UNTIL_MAX = {"ignore_eos": True}


@pytest.fixture
def keys(transactional_db, make_user, multi_model_site):
    user = make_user("models-user")
    admin = make_user("models-admin")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    yield ApiKey.objects.create_key(user)[1], ApiKey.objects.create_key(admin)[1]
    time.sleep(0.3)  # usage rows land before the database is flushed


def client(site, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{site.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_models_lists_every_model_and_adapter_as_vllm_does(multi_model_site, keys):
    user_key, admin_key = keys
    models = {m.id: m for m in client(multi_model_site, admin_key).models.list()}
    assert list(models) == ["smol", "tiny2", "ad8", "ad16"]
    paths = multi_model_site.paths
    assert models["ad8"].parent == "smol" and models["ad8"].root == str(paths["ad8"])
    assert models["ad16"].parent == "tiny2" and models["ad16"].root == str(paths["ad16"])
    assert models["smol"].parent is None and models["smol"].root == str(paths["smol"])
    # ad16 is staff-only: to everyone else it does not exist.
    visible = [m.id for m in client(multi_model_site, user_key).models.list()]
    assert visible == ["smol", "tiny2", "ad8"]
    with pytest.raises(openai.NotFoundError) as hidden:
        client(multi_model_site, user_key).models.retrieve("ad16")
    assert hidden.value.body["code"] == "model_not_found"


def test_model_chooses_the_engine_and_adapter(multi_model_site, keys):
    _user_key, admin_key = keys
    api = client(multi_model_site, admin_key)
    texts = {}
    for model in ("smol", "tiny2", "ad8", "ad16"):
        done = api.completions.create(
            model=model, prompt="Once upon a time", max_tokens=6, temperature=0, extra_body=UNTIL_MAX
        )
        assert done.model == model and done.usage.completion_tokens == 6
        texts[model] = done.choices[0].text
    assert len(set(texts.values())) == 4  # four different weights, four different answers


def test_an_unknown_model_is_openais_404(multi_model_site, keys):
    with pytest.raises(openai.NotFoundError) as error:
        client(multi_model_site, keys[0]).chat.completions.create(
            model="gpt-4", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    body = error.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model" and "gpt-4" in body["message"]


def test_an_admin_loads_and_unloads_an_adapter_at_run_time(multi_model_site, keys):
    import httpx

    user_key, admin_key = keys
    url, path = multi_model_site.url, str(multi_model_site.paths["ad8"])
    body = {"lora_name": "late", "lora_path": path, "base_model_name": "smol"}
    refused = httpx.post(
        f"{url}/v1/load_lora_adapter", json=body, headers={"Authorization": f"Bearer {user_key}"}
    )
    assert refused.status_code == 404
    admin = {"Authorization": f"Bearer {admin_key}"}
    loaded = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=admin, timeout=60)
    assert loaded.status_code == 200, loaded.text
    api = client(multi_model_site, admin_key)
    assert "late" in [m.id for m in api.models.list()]
    late = api.completions.create(
        model="late", prompt="Hello", max_tokens=4, temperature=0, extra_body=UNTIL_MAX
    )
    ad8 = api.completions.create(
        model="ad8", prompt="Hello", max_tokens=4, temperature=0, extra_body=UNTIL_MAX
    )
    assert late.choices[0].text == ad8.choices[0].text  # the same weights
    bad = httpx.post(
        f"{url}/v1/load_lora_adapter", json={**body, "lora_path": "/nonexistent"}, headers=admin, timeout=60
    )
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, headers=admin, timeout=60)
    assert gone.status_code == 200
    assert "late" not in [m.id for m in api.models.list()]
    again = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, headers=admin, timeout=60)
    assert again.status_code == 404
