"""A full embedding queue is a 429 in OpenAI's shape, and the request's work is counted
against its API key's share."""

from __future__ import annotations

import numpy as np
import pytest

from conversations.api import embeddings as embeddings_view
from conversations.models import ApiKey
from inference.errors import EngineOverloadedError

pytestmark = pytest.mark.django_db(transaction=True)


class FullQueue:
    model_name = "tiny"
    vocab_size = 1000
    max_input_tokens = 100

    def __init__(self) -> None:
        self.owners: list[str | None] = []

    async def aembed_ids(self, ids, owner=None):
        self.owners.append(owner)
        if len(self.owners) > 1:
            raise EngineOverloadedError("this user already has 60 tokens waiting to be embedded")
        return np.zeros((len(ids), 4), dtype=np.float32)


def test_a_full_embedding_queue_is_429_in_openai_shape(client, make_user, monkeypatch):
    embedder = FullQueue()

    async def get():
        return embedder

    monkeypatch.setattr(embeddings_view, "aget_embedder", get)
    key, raw = ApiKey.objects.create_key(make_user(), name="embed")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    body = {"model": "tiny", "input": [[1, 2, 3]]}
    first = client.post("/v1/embeddings", body, content_type="application/json", **headers)
    assert first.status_code == 200
    response = client.post("/v1/embeddings", body, content_type="application/json", **headers)
    assert response.status_code == 429
    assert response["Retry-After"]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    assert "embedding queue is full" in error["message"]
    assert embedder.owners == [f"api-key:{key.pk}"] * 2
