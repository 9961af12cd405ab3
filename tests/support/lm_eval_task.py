"""A small multiple-choice task for lm-evaluation-harness, written to disk (no data set
download), and runs of it through ``local-completions`` against ``/v1/completions`` and
through lm_eval's own HF transformers backend on the same weights.

``local-completions`` scores each (context, choice) pair with one request: the token ids
of context + choice, ``echo: true``, ``logprobs: 1``, ``max_tokens: 1``; it sums the echoed
``token_logprobs`` of the choice's tokens. The HF backend computes the same sums from its
own forward pass. Both pick the choice with the highest sum.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASK = "chatsite_mc"
_WORDS = ["red", "blue", "green", "cat", "dog", "river", "stone", "cloud", "seven", "north", "music", "bread"]


def write_task(directory: Path, num_docs: int = 24, seed: int = 0) -> Path:
    """A task YAML and its JSON-lines data under ``directory``; returns the directory
    (lm_eval's ``include_path``). Questions are arithmetic and word-pairs, with four choices
    of different lengths, so choices differ in their log-likelihoods by far more than the
    last bits of fp32."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    docs = []
    for i in range(num_docs):
        if i % 2:
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            answer = a + b
            wrong = rng.sample([n for n in range(2, 41) if n != answer], 3)
            choices = [str(n) for n in [answer, *wrong]]
            question = f"Question: What is {a} plus {b}?\nAnswer:"
        else:
            word = rng.choice(_WORDS)
            choices = rng.sample(_WORDS, 4)
            if word not in choices:
                choices[0] = word
            question = f"Question: Which word is '{word}'?\nAnswer:"
            answer = word
        rng.shuffle(choices)
        docs.append({"question": question, "choices": choices, "answer": choices.index(str(answer))})
    data = directory / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (directory / f"{TASK}.yaml").write_text(
        f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
    )
    return directory


@dataclass
class EvalRun:
    accuracy: float
    seconds: float
    loglikelihoods: list[list[float]]  # per document, per choice


def _offline() -> None:
    # The task's data are local files: nothing may reach for a hub.
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"


def run_lm_eval(task_dir: Path, model: str, model_args: str) -> EvalRun:
    """``lm_eval.simple_evaluate`` of the task with ``model`` (``local-completions`` or
    ``hf``); the accuracy, the wall time and each document's per-choice log-likelihoods."""
    _offline()
    import lm_eval
    from lm_eval.tasks import TaskManager

    started = time.perf_counter()
    results: dict[str, Any] = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(task_dir)),
        batch_size=1,
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    seconds = time.perf_counter() - started
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    loglikelihoods = [[float(r[0]) for r in s["filtered_resps"]] for s in samples]
    return EvalRun(float(results["results"][TASK]["acc,none"]), seconds, loglikelihoods)


def api_model_args(base_url: str, model_name: str, tokenizer_dir: Path) -> str:
    """``local-completions`` against ``base_url`` (the site's ``/v1``), tokenizing with the
    model's own HF tokenizer; the API key comes from ``OPENAI_API_KEY``."""
    return (
        f"model={model_name},base_url={base_url}/completions,tokenizer={tokenizer_dir},"
        "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1,tokenized_requests=True"
    )


def hf_model_args(model_dir: Path) -> str:
    return f"pretrained={model_dir},dtype=float32,device=cpu"
