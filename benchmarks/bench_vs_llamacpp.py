"""Single-stream decode: our engine against llama.cpp on the same GGUF, one after the other.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_vs_llamacpp.py [--gguf FILE] [--tokens 128]
        [--threads N] [--llama-runner python|node] [--llama-python PYTHON]
        [--node NODE] [--node-modules DIR]

The same 8 chat prompts (token ids from our tokenizer, so both see the same input),
128 greedy tokens each, ignore EOS. Decode tokens/s counts from the first generated
token to the last (prompt processing excluded), summed over the prompts. Both use the
same number of threads. llama.cpp runs in a subprocess that reads the job (GGUF,
prompt token ids, token count, threads) as JSON on stdin and prints tokens/s and the
output token ids as JSON:

``--llama-runner python`` (default)
    its Python bindings (``llama-cpp-python``), by default with this interpreter;
    ``--llama-python`` names another one (the bindings build llama.cpp from source,
    so they may live in a separate environment).
``--llama-runner node``
    ``llamacpp_node_runner.mjs`` next to this script, on the prebuilt llama.cpp CPU
    binaries that the npm package ``node-llama-cpp`` ships (no compiler, no download
    from GitHub). Install it outside the repo, skipping its postinstall::

        mkdir -p /opt/llamacpp && cd /opt/llamacpp && npm init -y
        NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --ignore-scripts node-llama-cpp@3.22.1

    ``--node-modules`` names that ``node_modules`` folder (default: $NODE_PATH, else
    /opt/llamacpp/node_modules).

Not part of the project's dependencies or CI.
"""

from __future__ import annotations

import argparse
import json
import os
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
NODE_RUNNER = Path(__file__).with_name("llamacpp_node_runner.mjs")
DEFAULT_NODE_MODULES = "/opt/llamacpp/node_modules"


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
    from inference.engine.llm_engine import LLMEngine
    from inference.sampling.params import SamplingParams

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


def llama_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str] | None]:
    """The subprocess that runs llama.cpp on a JSON job from stdin, and its environment."""
    if args.llama_runner == "python":
        return [args.llama_python, __file__, "--llama-only"], None
    env = dict(os.environ, NODE_PATH=args.node_modules, NODE_LLAMA_CPP_SKIP_DOWNLOAD="true")
    return [args.node, str(NODE_RUNNER)], env


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token sequences differ, or None when identical."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gguf", help="GGUF file (default: the installed SmolLM2)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="threads for both (default: torch's)")
    parser.add_argument("--llama-runner", choices=["python", "node"], default="python")
    parser.add_argument("--llama-python", default=sys.executable, help="interpreter with llama_cpp")
    parser.add_argument("--node", default="node", help="Node.js executable (--llama-runner node)")
    parser.add_argument(
        "--node-modules",
        default=os.environ.get("NODE_PATH") or DEFAULT_NODE_MODULES,
        help="node_modules folder holding node-llama-cpp (--llama-runner node)",
    )
    parser.add_argument("--llama-only", action="store_true", help=argparse.SUPPRESS)  # job JSON on stdin
    args = parser.parse_args()
    if args.llama_only:
        job = json.load(sys.stdin)
        print(json.dumps(run_llama_cpp(job["gguf"], job["prompts"], job["tokens"], job["threads"])))
        return

    import torch

    from inference.runner.model_files import default_model_path
    from inference.runner.model_loader import ensure_gguf_converted, load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    gguf = str(Path(args.gguf) if args.gguf else default_model_path())
    tokenizer = load_tokenizer(ensure_gguf_converted(Path(gguf)))
    prompts = [tokenizer.encode_chat([{"role": "user", "content": c}]) for c in CHATS]
    ours = run_ours(gguf, prompts, args.tokens)
    job = json.dumps({"gguf": gguf, "prompts": prompts, "tokens": args.tokens, "threads": threads})
    command, env = llama_command(args)
    done = subprocess.run(command, input=job, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        print(f"ours: {ours['tokens_per_s']:.1f} tok/s; llama.cpp failed:\n{done.stderr[-2000:]}")
        sys.exit(1)
    llama = json.loads(done.stdout.strip().splitlines()[-1])
    diverge = [first_difference(a, b) for a, b in zip(ours["outputs"], llama["outputs"], strict=True)]
    same = diverge.count(None)
    print(f"{Path(gguf).name}, {len(prompts)} prompts x {args.tokens} greedy tokens, {threads} threads")
    if "llama" in llama:
        print(f"llama.cpp build: {json.dumps(llama['llama'])}")
    print(f"ours:      {ours['tokens_per_s']:.1f} decode tok/s")
    print(f"llama.cpp: {llama['tokens_per_s']:.1f} decode tok/s ({args.llama_runner} runner)")
    print(f"ours / llama.cpp = {ours['tokens_per_s'] / llama['tokens_per_s']:.2f}x")
    print(f"identical token sequences: {same} of {len(prompts)} (llama.cpp quantizes activations to 8 bits)")
    if same < len(prompts):
        print(f"first differing position per prompt: {['-' if d is None else d for d in diverge]}")


if __name__ == "__main__":
    main()
