"""The KV disk tier serves a block only to the model that computed it, and only its owner
can read it: the fingerprint (served weights, tokenizer, KV layout) in every file's
header, checked on every read; the directory 0700 and every file 0600 whatever the umask."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
import torch

from chatsite_kernels.cpu import linear as cpu_linear
from inference.kv.disk import FINGERPRINT_FILE, DiskTier
from inference.kv.fingerprint import kv_fingerprint, tokenizer_digest
from inference.runner import weights_identity as identity
from inference.runner.model_loader import load_model
from tests.engine.engine_fixtures import TinyModel, greedy, random_prompts, run_to_completion
from tests.engine.test_kv_tiers_unit import BS, SHAPE, block_value, make_disk
from tests.support.fakes import make_tiny_model_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyModel, TinyModel]:
    """Two tiny random models of one shape (and one tokenizer), different weights."""
    root = tmp_path_factory.mktemp("twins")
    paths = [
        make_tiny_model_dir(root / name, arch="llama", seed=seed) for name, seed in (("a", 11), ("b", 12))
    ]
    return tuple(TinyModel(str(p), load_model(p, device="cpu"), hf=None) for p in paths)  # type: ignore[return-value]


# ---- files only the owner can read ----------------------------------------------------------


def test_the_tier_directory_is_0700_and_its_files_0600_whatever_the_umask(tmp_path: Path, umask_022) -> None:
    kv = tmp_path / "kv"
    kv.mkdir(mode=0o755)
    os.chmod(kv, 0o755)  # as an earlier version left it
    disk = make_disk(kv)
    disk.write(5, 0, (1, 2, 3, 4), block_value(5))
    disk.flush()
    assert mode(kv) == 0o700
    files = list(kv.iterdir())
    assert {p.name for p in files} == {FINGERPRINT_FILE, f"{5:016x}.kv"}
    assert all(mode(p) == 0o600 for p in files)
    disk.close()


def test_a_tier_directory_others_can_write_to_is_refused_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kv = tmp_path / "kv"
    kv.mkdir()
    os.chmod(kv, 0o777)
    with caplog.at_level(logging.WARNING, logger="inference.kv.disk"):
        disk = make_disk(kv)
    assert not disk.enabled and not list(kv.iterdir())
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert str(kv) in warning and "writable by other users" in warning and "off" in warning


# ---- a block file of another fingerprint is never served ------------------------------------


def test_tiers_of_two_fingerprints_sharing_a_directory_never_serve_each_others_blocks(tmp_path: Path) -> None:
    shape_args = (10**6, SHAPE, torch.float64)
    a = DiskTier(tmp_path, *shape_args, {"weights": "a", "block_size": BS})
    b = DiskTier(tmp_path, *shape_args, {"weights": "b", "block_size": BS})  # empties a's files
    a.write(5, 0, (1, 2, 3, 4), block_value(5))
    a.flush()
    b.write(5, 0, (1, 2, 3, 4), torch.zeros(SHAPE, dtype=torch.float64))  # same hash, b's K/V
    b.flush()
    assert a.lookup(5, 0, (1, 2, 3, 4))  # a still thinks it has the block
    assert a.read_async(5, 0, (1, 2, 3, 4)).result() is None  # but b's file is a miss
    assert a.foreign_blocks == 1 and a.corrupt_blocks == 0 and not a.lookup(5, 0, (1, 2, 3, 4))
    assert not (tmp_path / f"{5:016x}.kv").exists()  # removed
    a.write(6, 0, (6,) * BS, block_value(6))  # a's file in b's directory ...
    a.close()
    b.close()
    again = DiskTier(tmp_path, *shape_args, {"weights": "b", "block_size": BS})
    assert len(again) == 0 and again.foreign_blocks == 1  # ... is dropped when b starts again
    assert not list(tmp_path.glob("*.kv"))
    again.close()


def test_a_model_restarted_reuses_its_blocks_and_another_of_its_shape_never_gets_them(
    twins: tuple[TinyModel, TinyModel], tmp_path: Path
) -> None:
    """One disk directory, two models of one shape. A restarted A reads A's blocks; B, even
    running beside A and writing blocks under the same hashes, never serves A's, nor A B's."""
    a, b = twins
    prompt = random_prompts(a.tokenizer, 1, seed=70, min_len=70, max_len=70)[0]
    expected = {
        name: run_to_completion(m.engine(enable_prefix_caching=False), [prompt], greedy(8))[0].token_ids
        for name, m in (("a", a), ("b", b))
    }
    assert expected["a"] != expected["b"]  # the two models really differ
    first = a.engine(num_kv_blocks=64, kv_disk_dir=str(tmp_path))
    run_to_completion(first, [prompt], greedy(8))
    first.close()

    restarted = a.engine(num_kv_blocks=14, kv_disk_dir=str(tmp_path))
    out = run_to_completion(restarted, [prompt], greedy(8))[0]
    assert out.token_ids == expected["a"]
    assert restarted.stats().kv_tiers["disk"]["hit_tokens"] == out.num_cached_tokens > 0

    beside = b.engine(num_kv_blocks=14, kv_disk_dir=str(tmp_path))  # starts while A runs
    out = run_to_completion(beside, [prompt], greedy(8))[0]
    assert out.token_ids == expected["b"] and out.num_cached_tokens == 0
    beside.tiers.disk.flush()  # B's blocks now sit under the names A's index knows

    hits_before = restarted.stats().kv_tiers["disk"]["hit_tokens"]
    churn = random_prompts(a.tokenizer, 6, seed=71, min_len=60, max_len=60)
    run_to_completion(restarted, churn, greedy(2))  # pushes the prompt out of A's pool
    out = run_to_completion(restarted, [prompt], greedy(8))[0]
    assert out.token_ids == expected["a"]
    disk_stats = restarted.stats().kv_tiers["disk"]
    assert disk_stats["foreign_blocks"] > 0 and disk_stats["hit_tokens"] == hits_before
    restarted.close()
    beside.close()


# ---- what the fingerprint covers ------------------------------------------------------------


def test_the_fingerprint_names_the_served_weights_the_tokenizer_and_the_kv_layout(
    twins: tuple[TinyModel, TinyModel],
) -> None:
    a, b = twins
    model_a, tok_a, _ = a.loaded

    def fingerprint(model: torch.nn.Module, tokenizer, block_size: int = 16) -> dict:
        return kv_fingerprint(
            identity.weights_identity(model), tokenizer, model.kv_spec, block_size, torch.float32
        )

    base = fingerprint(model_a, tok_a)
    assert base["weights"]["files"] and base["weights"]["quantized"] is False
    reloaded = load_model(a.path, device="cpu")  # the same files: the same fingerprint
    assert fingerprint(reloaded[0], reloaded[1]) == base
    assert fingerprint(b.loaded[0], tok_a)["weights"] != base["weights"]  # same shape, other weights
    assert fingerprint(model_a, tok_a, block_size=8)["kv"] != base["kv"]
    template = tok_a.hf.chat_template
    try:
        tok_a.hf.chat_template = template + "{# another template #}"
        assert tokenizer_digest(tok_a) != base["tokenizer"]
    finally:
        tok_a.hf.chat_template = template
    assert tokenizer_digest(tok_a) == base["tokenizer"]


def test_a_model_without_a_source_is_named_by_the_weights_it_serves_packed_ones_included(
    twins: tuple[TinyModel, TinyModel],
) -> None:
    """A stand-in model (no files to hash): the digest covers every linear weight even after
    the CPU kernels' packing dropped the fp32 originals (the norm weights alone would match
    any model of the same shape)."""
    a, _ = twins
    model, tokenizer, config = load_model(a.path, device="cpu")
    delattr(model, identity.ATTRIBUTE)
    engine = TinyModel(a.path, (model, tokenizer, config), hf=None).engine()  # packs, may release
    before = identity.weights_identity(model)
    assert set(before) == {"served"}
    held = [
        (module, name)
        for module in model.modules()
        for name in identity.KERNEL_WEIGHTS
        if module.__dict__.get(name) is not None
    ]
    if cpu_linear.available():  # the fp32 originals are gone: the panels are all there is
        assert held and any(getattr(m, "weight", True) is None for m in model.modules())
    with torch.no_grad():
        if held:  # packed by the engine (with the C kernels): change a panel, not a parameter
            module, name = held[0]
            part = module.__dict__[name]
            tensor = part[0] if isinstance(part, tuple) else getattr(part, "data", part)
            tensor.view(-1)[0] += 1
        else:
            next(m for m in model.modules() if hasattr(m, "out_features")).weight.view(-1)[0] += 1
    assert identity.weights_identity(model) != before
    engine.close()


def test_a_weights_file_digest_is_kept_by_path_size_and_mtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(identity, "PERSIST_MIN_BYTES", 0)
    monkeypatch.setattr(identity, "_digests", {})
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"x" * 1000)
    cache = tmp_path / "cache"
    first = identity.file_digest(weights, cache)
    assert len(list((cache / "digests").iterdir())) == 1
    stamp = weights.stat().st_mtime_ns
    weights.write_bytes(b"y" * 1000)
    os.utime(weights, ns=(stamp, stamp))
    identity._digests.clear()  # a new process: the digest comes from the cache, not the bytes
    assert identity.file_digest(weights, cache) == first
    os.utime(weights, ns=(stamp + 10**9, stamp + 10**9))  # replaced: a new mtime, a new digest
    assert identity.file_digest(weights, cache) != first
