"""EMBEDDING_MODEL: a Hugging Face encoder directory, mean-pooled over its attention mask."""

from __future__ import annotations

import pytest
import torch

from inference.runner.hf_encoder import HFEncoder

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "dog", "ran"]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = tmp_path_factory.mktemp("encoder")
    (path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    BertModel(config).save_pretrained(path)
    return path


def test_padding_does_not_change_a_vector_and_rows_are_normalised(encoder_dir):
    encoder = HFEncoder(encoder_dir)
    short, long = encoder.encode("the cat"), encoder.encode("the dog ran on the mat")
    together = encoder.embed([short, long])
    alone = encoder.embed([short])
    torch.testing.assert_close(together[0], alone[0], atol=1e-5, rtol=1e-4)
    assert torch.allclose(together.norm(dim=-1), torch.ones(2), atol=1e-5)
    with pytest.raises(ValueError, match="at most 64"):
        encoder.embed([[5] * 100])


@pytest.mark.django_db
def test_the_site_uses_it_when_configured(encoder_dir, settings):
    from conversations.documents import embedder as embedder_module

    settings.EMBEDDING_MODEL = str(encoder_dir)
    embedder_module._encoder = None
    try:
        embedder = embedder_module.get_embedder()
        assert embedder.model_name == encoder_dir.name
        vectors = embedder.embed_texts(["the cat sat", "the dog ran"])
        assert vectors.shape == (2, 32) and vectors.dtype.name == "float32"
    finally:
        embedder_module._encoder = None
