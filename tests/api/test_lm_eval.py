"""lm-evaluation-harness's ``local-completions`` against ``/v1/completions`` gives the same
multiple-choice accuracy as its HF transformers backend on the same weights (the live
server's tiny random Llama, loaded by HF from the same directory), on a task the test
writes to disk."""

from __future__ import annotations

import pytest

from tests.support.lm_eval_task import api_model_args, hf_model_args, run_lm_eval, write_task


def test_lm_eval_local_completions_agrees_with_hf(
    live_site, api_key, model_name, tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", api_key)
    task_dir = write_task(tmp_path / "task", num_docs=12)
    ours = run_lm_eval(
        task_dir, "local-completions", api_model_args(f"{live_site.url}/v1", model_name, tiny_model_dir)
    )
    hf = run_lm_eval(task_dir, "hf", hf_model_args(tiny_model_dir))
    assert len(ours.loglikelihoods) == len(hf.loglikelihoods) == 12
    for mine, theirs in zip(ours.loglikelihoods, hf.loglikelihoods, strict=True):
        assert mine == pytest.approx(theirs, abs=2e-3)
    assert ours.accuracy == hf.accuracy
