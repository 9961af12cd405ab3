"""ENGINE_MODELS and the per-model settings beside it (conversations.ops.model_settings)."""

from __future__ import annotations

import pytest

from conversations.ops.model_settings import ModelEntry, check_fit, parse_models


def test_the_one_model_shorthand_keeps_its_whole_budget():
    assert parse_models("", "/m/a.gguf", 1.5) == [ModelEntry(None, "/m/a.gguf", 1.5)]
    assert parse_models("", "", 1.0) == [ModelEntry(None, None, 1.0)]


def test_several_models_split_the_kv_budget_in_the_stated_proportions():
    entries = parse_models(
        "smol=,tiny=/m/tiny,big=/m/big",
        "",
        2.0,
        kv_gb="big=0.5",
        kv_shares="smol=2,tiny=1",
        descriptions="smol=Small and quick",
        staff_models="tiny",
    )
    by_name = {e.name: e for e in entries}
    assert [e.name for e in entries] == ["smol", "tiny", "big"]
    assert by_name["smol"].path is None and by_name["tiny"].path == "/m/tiny"
    assert by_name["big"].kv_cache_gb == 0.5  # set per model
    assert by_name["smol"].kv_cache_gb == pytest.approx(1.0) and by_name["tiny"].kv_cache_gb == pytest.approx(
        0.5
    )
    assert by_name["smol"].description == "Small and quick" and by_name["tiny"].staff_only


@pytest.mark.parametrize(
    ("models", "extra", "message"),
    [
        ("smol", {}, "expected name=value items"),
        ("a=/x,a=/y", {}, "given twice"),
        ("a=/x", {"kv_shares": "b=1"}, "b is not in ENGINE_MODELS"),
        ("a=/x,b=/y", {"kv_gb": "a=1.0"}, "nothing is left for b"),
        ("a=/x", {"kv_shares": "a=-1"}, "must be more than 0"),
    ],
)
def test_bad_settings_name_what_is_wrong(models, extra, message):
    with pytest.raises(ValueError, match=message):
        parse_models(models, "", 1.0, **extra)


def test_a_model_that_does_not_fit_is_refused_in_one_line(tmp_path):
    weights = tmp_path / "w.gguf"
    weights.write_bytes(b"\0" * (3 << 20))
    entries = parse_models(f"small=,big={weights}", "", 0.002, kv_shares="small=1,big=1")
    check_fit(entries, memory_gb=1.0)  # fits
    with pytest.raises(ValueError) as refused:
        check_fit(entries, memory_gb=0.003)
    message = str(refused.value)
    assert "\n" not in message and "model 'big' does not fit" in message and "ENGINE_MEMORY_GB" in message
