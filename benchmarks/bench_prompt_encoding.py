"""A 2,000-message ``/v1`` chat request encoded with the default model's tokenizer (SmolLM2's
ChatML template): how long ``inference.prompt`` takes, next to the ways it was done before.

- *this encoder*: ``conversations.api.app.encode_chat`` as a request calls it (in a worker
  thread: the linear encoder, then the leading system prompt's shared length), and the
  encoder alone; best and median of ``--runs``.
- *the previous /v1 path*: past 64 messages it rendered the template once and tokenised the
  whole text (not cache-stable: merges may cross turns); at most 64 it rendered every
  prefix (``tests.support.prompt_reference``, O(n²)), timed here on ``--old-messages``.

    .venv/bin/python -m benchmarks.bench_prompt_encoding [--messages 2000] [--runs 5] [--old-messages 2000]

Printed only; no figure is asserted. A shared machine makes the milliseconds noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_prompt import WORDS


def request_messages(count: int, seed: int = 0) -> list[dict]:
    """A system prompt and ``count`` alternating questions and answers, as a client sends them."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "You answer questions about the coast. Be brief."}]
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        words = rng.randint(5, 20 if role == "user" else 60)
        messages.append({"role": role, "content": " ".join(rng.choice(WORDS) for _ in range(words)) + "."})
    return messages


@dataclass
class Timing:
    wall: list[float]  # seconds per run
    cpu: list[float]  # this process's CPU seconds per run, all threads (steadier on a shared machine)


def timed(fn: Callable[[], object], runs: int) -> tuple[Timing, object]:
    timing, result = Timing([], []), None
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        timing.wall.append(time.perf_counter() - wall)
        timing.cpu.append(time.process_time() - cpu)
    return timing, result


def report(label: str, timing: Timing) -> float:
    best, median = min(timing.wall) * 1000, statistics.median(timing.wall) * 1000
    print(f"{label}: best {best:.1f} ms, median {median:.1f} ms (CPU best {min(timing.cpu) * 1000:.1f} ms)")
    return best / 1000


def load_tokenizer():
    from inference.runner.model_files import default_model_path
    from inference.runner.model_loader import ensure_gguf_converted, load_tokenizer

    return load_tokenizer(ensure_gguf_converted(default_model_path()))


def setup_django() -> None:
    os.environ["SQLITE_PATH"] = str(Path(tempfile.mkdtemp(prefix="bench-encoding-")) / "db.sqlite3")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    import django

    django.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--old-messages", type=int, default=2000, help="0 skips the per-prefix renderer")
    args = parser.parse_args()
    setup_django()
    from types import SimpleNamespace

    from conversations.api.app import encode_chat as api_encode_chat
    from inference.prompt import encode_chat, encode_segments
    from tests.support.prompt_reference import per_prefix_segments

    tokenizer = load_tokenizer()
    messages = request_messages(args.messages)
    engine = SimpleNamespace(tokenizer=tokenizer)
    encode_chat(tokenizer, messages)  # warm: the template's compilation, the tokenizer's caches
    timing, (prompt, shared) = timed(
        lambda: asyncio.run(api_encode_chat(engine, messages, shared=True)), args.runs
    )
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    print(f"{len(messages)} messages, {len(prompt)} prompt tokens ({shared} shared system prompt tokens)")
    new = report("this encoder, as /v1 calls it", timing)
    report("  the encoder alone", timed(lambda: encode_chat(tokenizer, messages), args.runs)[0])
    texts = [
        tokenizer.decode(s, skip_special_tokens=False) for s in encode_segments(tokenizer, messages).segments
    ]
    report(
        "  of which tokenising its segments (one batch)",
        timed(lambda: tokenizer.encode_batch(texts), args.runs)[0],
    )
    render = lambda: tokenizer.apply_chat_template(messages)  # noqa: E731
    report(
        "  of which one render of the template (it renders the whole list four times)",
        timed(render, args.runs)[0],
    )
    whole = lambda: tokenizer.encode(tokenizer.apply_chat_template(messages))  # noqa: E731
    timing, whole_ids = timed(whole, args.runs)
    report("the previous /v1 path past 64 messages (one render, tokenised whole)", timing)
    print(f"  same ids as this encoder: {whole_ids == prompt}")
    if args.old_messages:
        old_messages = request_messages(args.old_messages)
        timing, encoding = timed(lambda: per_prefix_segments(tokenizer, old_messages), 1)
        assert encoding.token_ids == encode_chat(tokenizer, old_messages), "the encoders disagree"
        old = report(f"every prefix rendered ({len(old_messages)} messages)", timing)
        if len(old_messages) == len(messages):
            print(f"  this encoder is {old / new:.0f}x faster")


if __name__ == "__main__":
    main()
