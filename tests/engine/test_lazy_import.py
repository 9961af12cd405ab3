"""``import inference`` must stay cheap: a Django module imports it at the top, and torch
(with the model code) should load only when an engine is built."""

import os
import subprocess
import sys
from pathlib import Path

import inference

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_inference_does_not_load_torch() -> None:
    assert _run("import inference, sys; print('torch' in sys.modules)") == "False"


def test_plain_public_names_import_without_torch() -> None:
    code = (
        "import sys\n"
        "from inference import SamplingParams, EngineConfig, PromptTooLongError, StreamDelta\n"
        "assert SamplingParams(max_tokens=3).max_tokens == 3\n"
        "print('torch' in sys.modules)"
    )
    assert _run(code) == "False"


def test_every_public_name_resolves_to_its_object() -> None:
    from inference.engine.llm_engine import LLMEngine
    from inference.sampling.params import SamplingParams

    assert inference.LLMEngine is LLMEngine and inference.SamplingParams is SamplingParams
    for name in inference.__all__:
        assert getattr(inference, name).__name__ == name
    assert set(inference.__all__) <= set(dir(inference))
