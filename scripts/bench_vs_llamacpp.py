"""Single-stream decode: our engine against llama.cpp on the same GGUF, one after the other.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_vs_llamacpp.py [--gguf FILE] [--tokens 128]
        [--threads N] [--llama-python PYTHON]

The same 8 chat prompts (token ids from our tokenizer, so both see the same input),
128 greedy tokens each, ignore EOS. Decode tokens/s counts from the first generated
token to the last (prompt processing excluded), summed over the prompts. llama.cpp
runs through its Python bindings (``llama-cpp-python``) in a subprocess, by default
with this interpreter; ``--llama-python`` names another one (the bindings build
llama.cpp from source, so they may live in a separate environment). Not part of the
project's dependencies or CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for learning Python.",
    "Explain photosynthesis to a child.",
    "What is the difference between a list and a tuple?",
    "Tell me a short story about a robot.",
    "How do I boil an egg?",
    "Why is the sky blue?",
]


def run_llama_cpp(gguf: str, prompts: list[list[int]], tokens: int, threads: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=1024, n_threads=threads, n_batch=512, verbose=False)
    decode_s, produced, outputs = 0.0, 0, []
    for prompt in prompts:
        llm.reset()
        out: list[int] = []
        first = None
        for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
            if first is None:
                first = time.perf_counter()
            out.append(token)
            if len(out) == tokens:
                break
        decode_s += time.perf_counter() - first
        produced += len(out) - 1
        outputs.append(out)
    return {"tokens_per_s": produced / decode_s, "outputs": outputs}


def run_ours(gguf: str, prompts: list[list[int]], tokens: int) -> dict:
    from inference.config import EngineConfig
    from inference.engine import LLMEngine
    from inference.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=gguf, device="cpu"))
    decode_s, produced, outputs = 0.0, 0, []
    for prompt in prompts:
        request = engine.add_request(
            prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        )
        engine.step()  # prefill + the first token
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        decode_s += time.perf_counter() - start
        out = engine.request_output(request).token_ids
        produced += len(out) - 1
        outputs.append(out)
    return {"tokens_per_s": produced / decode_s, "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", help="GGUF file (default: the installed SmolLM2)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="threads for both (default: torch's)")
    parser.add_argument("--llama-python", default=sys.executable, help="interpreter with llama_cpp")
    parser.add_argument("--llama-only", help=argparse.SUPPRESS)  # subprocess mode: a JSON job file
    args = parser.parse_args()
    if args.llama_only:
        job = json.loads(Path(args.llama_only).read_text())
        print(json.dumps(run_llama_cpp(job["gguf"], job["prompts"], job["tokens"], job["threads"])))
        return

    import torch

    from inference.model_files import default_model_path
    from inference.model_loader import ensure_gguf_converted, load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    gguf = str(Path(args.gguf) if args.gguf else default_model_path())
    tokenizer = load_tokenizer(ensure_gguf_converted(Path(gguf)))
    prompts = [tokenizer.encode_chat([{"role": "user", "content": c}]) for c in CHATS]
    ours = run_ours(gguf, prompts, args.tokens)
    job = Path("var") / "llamacpp-job.json"
    job.parent.mkdir(exist_ok=True)
    job.write_text(json.dumps({"gguf": gguf, "prompts": prompts, "tokens": args.tokens, "threads": threads}))
    done = subprocess.run(
        [args.llama_python, __file__, "--llama-only", str(job)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        print(f"ours: {ours['tokens_per_s']:.1f} tok/s; llama.cpp failed:\n{done.stderr[-2000:]}")
        sys.exit(1)
    llama = json.loads(done.stdout.strip().splitlines()[-1])
    same = sum(a == b for a, b in zip(ours["outputs"], llama["outputs"], strict=True))
    print(f"{Path(gguf).name}, {len(prompts)} prompts x {args.tokens} greedy tokens, {threads} threads")
    print(f"ours:      {ours['tokens_per_s']:.1f} decode tok/s")
    print(f"llama.cpp: {llama['tokens_per_s']:.1f} decode tok/s")
    print(f"ours / llama.cpp = {ours['tokens_per_s'] / llama['tokens_per_s']:.2f}x")
    print(f"identical token sequences: {same} of {len(prompts)} (llama.cpp quantizes activations to 8 bits)")


if __name__ == "__main__":
    main()
