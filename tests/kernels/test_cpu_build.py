"""Building and loading the C kernels (``chatsite_kernels.cpu.build``): the hash-keyed cache,
and the PyTorch fallback with one warning when there is no compiler."""

from __future__ import annotations

import logging

import pytest
import torch

from chatsite_kernels.cpu import build as cpu_build
from chatsite_kernels.cpu import decode as cpu_decode
from chatsite_kernels.cpu import layer_ops as cpu_layer_ops
from chatsite_kernels.cpu import linear as cpu_linear
from chatsite_kernels.reference import paged_attention_ref
from inference.layers import attention
from tests.kernels.cases import max_err
from tests.kernels.test_cpu_decode import ATOL, decode_step


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    """An empty build cache; the real libraries are loaded again afterwards."""
    monkeypatch.setenv("CHATSITE_KERNEL_CACHE", str(tmp_path))
    cpu_build.load_library.cache_clear()
    yield tmp_path
    cpu_build.load_library.cache_clear()


@pytest.fixture
def no_compiler(fresh_cache, monkeypatch):
    """The kernels as on a machine without gcc."""
    monkeypatch.setattr(cpu_build, "COMPILER", str(fresh_cache / "no-such-gcc"))


def test_missing_compiler_falls_back_to_torch_with_one_warning(no_compiler, monkeypatch, caplog) -> None:
    q, k, v, k_cache, v_cache, ctx = decode_step([7, 40, 1, 33], seed=1)
    with caplog.at_level(logging.WARNING, logger="chatsite_kernels.cpu.build"):
        assert not cpu_decode.available()
        torch_calls = []
        real = attention.decode_attention_torch
        monkeypatch.setattr(attention, "decode_attention_torch", lambda *a: torch_calls.append(1) or real(*a))
        out = attention.paged_attention(q, k, v, k_cache, v_cache, ctx, 0.125)
        attention.paged_attention(q, k, v, k_cache, v_cache, ctx, 0.125)
    ref = paged_attention_ref(
        q, k_cache, v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, 0.125
    )
    assert torch_calls
    assert max_err(out, ref) <= ATOL
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1
    assert "paged_decode" in warnings[0].getMessage() and "no-such-gcc" in warnings[0].getMessage()


def test_linear_layers_fall_back_to_torch_without_a_compiler(no_compiler) -> None:
    from inference.layers.linear import Linear

    layer = Linear(24, 40, bias=True)
    x = torch.randn(3, 24)
    with torch.inference_mode():
        assert not cpu_linear.supports(x, layer.weight, layer.bias)
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_disabled_by_environment(fresh_cache, monkeypatch) -> None:
    monkeypatch.setenv("CHATSITE_CPU_KERNELS", "0")
    assert not cpu_decode.available()
    assert not cpu_linear.available()
    assert not cpu_layer_ops.available()
    assert not list(fresh_cache.iterdir())  # nothing was built


def test_build_is_cached_by_source_flags_and_cpu(fresh_cache, monkeypatch) -> None:
    assert cpu_decode.available() and cpu_linear.available() and cpu_layer_ops.available()
    built = sorted(fresh_cache.iterdir())
    assert [p.name.split("-")[0] for p in built] == ["layer_ops", "linear", "paged_decode"]
    assert all(p.suffix == ".so" for p in built)  # no temporary file left behind
    mtimes = [p.stat().st_mtime_ns for p in built]
    cpu_build.load_library.cache_clear()
    assert cpu_decode.available() and cpu_linear.available() and cpu_layer_ops.available()
    assert [p.stat().st_mtime_ns for p in built] == mtimes  # loaded from the cache, not rebuilt
    path = built[2]
    source = (cpu_build.SOURCES / "paged_decode.c").read_bytes()
    assert cpu_build.library_path("paged_decode", source) == path
    assert cpu_build.library_path("paged_decode", source + b"\n") != path
    flags = cpu_build.CFLAGS
    monkeypatch.setattr(cpu_build, "CFLAGS", (*flags, "-DEXTRA"))
    assert cpu_build.library_path("paged_decode", source) != path
    monkeypatch.setattr(cpu_build, "CFLAGS", flags)
    monkeypatch.setattr(cpu_build, "cpu_signature", lambda: "another machine")
    assert cpu_build.library_path("paged_decode", source) != path


def test_the_cache_key_includes_the_compilers_version(monkeypatch) -> None:
    source = (cpu_build.SOURCES / "paged_decode.c").read_bytes()
    path = cpu_build.library_path("paged_decode", source)
    assert "gcc" in cpu_build.compiler_version(cpu_build.COMPILER).lower()
    monkeypatch.setattr(cpu_build, "compiler_version", lambda compiler: "gcc (Debian 99.1.0) 99.1.0")
    assert cpu_build.library_path("paged_decode", source) != path


def test_the_asan_build_has_its_own_cache_entry(monkeypatch) -> None:
    monkeypatch.delenv("CHATSITE_KERNEL_ASAN", raising=False)  # the ASan run itself sets it
    source = (cpu_build.SOURCES / "linear.c").read_bytes()
    plain = cpu_build.library_path("linear", source)
    monkeypatch.setenv("CHATSITE_KERNEL_ASAN", "1")
    assert "-fsanitize=address" in cpu_build.cflags()
    assert cpu_build.library_path("linear", source) != plain


@pytest.fixture
def shared_cache(fresh_cache):
    cpu_build._cache_refusal.cache_clear()
    fresh_cache.chmod(0o777)
    yield fresh_cache
    fresh_cache.chmod(0o700)
    cpu_build._cache_refusal.cache_clear()


def test_a_cache_dir_writable_by_others_is_refused_with_one_warning(shared_cache, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="chatsite_kernels.cpu.build"):
        assert not cpu_decode.available()
        assert not cpu_linear.available()
        assert not cpu_layer_ops.available()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "writable by other users" in warnings[0]
    assert not list(shared_cache.iterdir())  # nothing built or loaded from it
    from inference.layers.linear import Linear

    layer = Linear(24, 40, bias=True)
    x = torch.randn(3, 24)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_a_new_build_removes_old_unused_builds_and_stale_temporaries(fresh_cache) -> None:
    import os
    import time

    now = time.time()
    old = fresh_cache / "linear-00000000000000000000.so"
    recent = fresh_cache / "linear-11111111111111111111.so"
    stale_tmp = fresh_cache / "linear-22222222222222222222.so.abc.tmp"
    other_library = fresh_cache / "layer_ops-33333333333333333333.so"
    for path in (old, recent, stale_tmp, other_library):
        path.write_bytes(b"")
    week_ago = now - cpu_build.PRUNE_AFTER_S - 60
    for path in (old, stale_tmp, other_library):
        os.utime(path, (week_ago, week_ago))
    assert cpu_linear.available()  # builds linear-<current key>.so
    assert not old.exists() and not stale_tmp.exists()
    assert recent.exists()  # another checkout's build, still in use
    assert other_library.exists()  # only the rebuilt library's old builds go
    assert cpu_build.library_path("linear", (cpu_build.SOURCES / "linear.c").read_bytes()).exists()
