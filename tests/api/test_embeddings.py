"""/v1/embeddings with the official openai client against a live site on the tiny model."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
import torch

from tests.api.conftest import wait_for_rows


def hf_mean_pooled(model_dir, texts: list[str]) -> np.ndarray:
    """transformers' last hidden state, averaged over the tokens and L2-normalised."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
            hidden = model(input_ids=ids).last_hidden_state[0].mean(0)
            rows.append(torch.nn.functional.normalize(hidden, dim=-1).numpy())
    return np.stack(rows)


@pytest.mark.smoke
def test_float_and_base64_agree_and_match_transformers(openai_client, model_name, tiny_model_dir, api_user):
    texts = ["It was the best of times, it was the worst of times.", "Call me Ishmael."]
    as_float = openai_client.embeddings.create(model=model_name, input=texts, encoding_format="float")
    # Without encoding_format the client asks for base64 itself and decodes it to floats.
    decoded = openai_client.embeddings.create(model=model_name, input=texts)
    raw_b64 = openai_client.embeddings.create(model=model_name, input=texts, encoding_format="base64")
    assert [d.index for d in as_float.data] == [0, 1]
    assert as_float.model == model_name
    got = np.array([d.embedding for d in as_float.data], dtype=np.float32)
    np.testing.assert_array_equal(got, np.array([d.embedding for d in decoded.data], dtype=np.float32))
    from_b64 = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw_b64.data])
    np.testing.assert_array_equal(got, from_b64)
    np.testing.assert_allclose(got, hf_mean_pooled(tiny_model_dir, texts), atol=2e-4, rtol=1e-3)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens > 0
    rows = wait_for_rows(api_user, 3, endpoint="/v1/embeddings")
    assert [r.status_code for r in rows] == [200, 200, 200]


def test_token_arrays_and_a_single_string(openai_client, model_name):
    one = openai_client.embeddings.create(model=model_name, input="hello world")
    ids = openai_client.embeddings.create(model=model_name, input=[[1, 2, 3], [4, 5]])
    flat = openai_client.embeddings.create(model=model_name, input=[1, 2, 3])
    assert len(one.data) == 1 and len(ids.data) == 2
    assert ids.usage.prompt_tokens == 5
    np.testing.assert_allclose(ids.data[0].embedding, flat.data[0].embedding, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": [[10**9]]}, "input"),
        ({"input": [[1] * 100_000]}, "input"),
        ({"input": [[1] * 2000] * 20}, "input"),
        ({"input": "x", "dimensions": 3}, "dimensions"),
    ],
)
def test_bad_input_is_a_400_naming_the_param(openai_client, model_name, kwargs, param):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.embeddings.create(model=model_name, **kwargs)
    assert caught.value.body["param"] == param


def test_unknown_model_is_a_404(openai_client):
    with pytest.raises(openai.NotFoundError):
        openai_client.embeddings.create(model="no-such-model", input="x")
