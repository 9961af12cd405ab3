"""A document's text, passages and token counts, worked out in a child process at the
lowest CPU priority when the embedder's tokenizer can go with it.

Reading a file is seconds of Python: parsing (a DOCX's XML, a PDF's pages), chunking, and
a tokenizer call for every paragraph and for the whole text. Under eager Celery the job
runs in a thread of the site process, where that work holds the interpreter's lock the
engine thread and the event loop need between every operation: a 600 KB upload stalled
every stream for hundreds of milliseconds at a time. The child has its own interpreter
and runs at nice ``READ_NICE``, so it takes the cores only when the server leaves them.

The child gets the file and the tokenizer (``tokenizers``' JSON), and sends back the text,
the chunks, the text's token count and each passage's embedding input. A child that fails
or runs past ``READ_TIMEOUT_S`` fails the file with a ``DocumentError``.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conversations.documents.chunking import Chunk, chunk_text
from conversations.documents.extract import Extracted, Progress, extract
from conversations.documents.formats import DocumentError

READ_NICE = 19
READ_TIMEOUT_S = 600.0
CHUNK_TOKENS = 256
CHUNK_OVERLAP = 48
_ROOT = str(Path(__file__).resolve().parents[2])
_CHILD_MAIN = (
    "import os, sys; os.nice(int(sys.argv[1])); "
    "from conversations.documents.reading import child_main; child_main()"
)

Encode = Callable[[str], list[int]]


@dataclass
class Reading:
    extracted: Extracted
    chunks: list[Chunk]
    num_tokens: int  # the whole text's
    inputs: list[list[int]] | None  # each passage's embedding input (None: no tokenizer)


def read(
    filename: str,
    kind: str,
    data: bytes,
    *,
    max_pages: int,
    encode: Encode | None,
    max_input_tokens: int,
    progress: Progress | None = None,
) -> Reading:
    """The reading itself (in whichever process calls it): extract, chunk, count."""
    extracted = extract(filename, kind, data, max_pages=max_pages, progress=progress)
    counting = {"count": lambda text: len(encode(text))} if encode is not None else {}
    chunks = chunk_text(extracted.text, max_tokens=CHUNK_TOKENS, overlap_tokens=CHUNK_OVERLAP, **counting)
    if encode is None:
        return Reading(extracted, chunks, sum(c.num_tokens for c in chunks), None)
    inputs = [encode(passage_text(c))[:max_input_tokens] or [0] for c in chunks]
    return Reading(extracted, chunks, len(encode(extracted.text)), inputs)


def passage_text(chunk: Chunk) -> str:
    """What a passage's embedding is computed from: its heading path, then its text."""
    return f"{chunk.heading}\n{chunk.text}".strip()


def read_apart(
    filename: str, kind: str, data: bytes, *, max_pages: int, tokenizer_json: str, max_input_tokens: int
) -> Reading:
    """``read`` in a child process at nice ``READ_NICE``, encoding with ``tokenizer_json``."""
    job = {
        "filename": filename,
        "kind": kind,
        "data": data,
        "max_pages": max_pages,
        "tokenizer_json": tokenizer_json,
        "max_input_tokens": max_input_tokens,
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD_MAIN, str(READ_NICE)],
            input=pickle.dumps(job),
            capture_output=True,
            env=env,
            timeout=READ_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise DocumentError(f"{filename} took too long to read.") from exc
    try:
        status, payload = pickle.loads(done.stdout)  # noqa: S301 - our own child's answer
    except Exception as exc:
        reason = "out of memory?" if done.returncode < 0 else f"exit status {done.returncode}"
        raise DocumentError(f"{filename} could not be read (the reader stopped: {reason}).") from exc
    if status == "ok":
        return payload
    if status == "document":
        raise DocumentError(payload)
    raise DocumentError(f"{filename} could not be read ({payload}).")


def child_main() -> None:
    """The child's entry point: a pickled job on stdin, ``(status, payload)`` on stdout."""
    job: dict[str, Any] = pickle.loads(sys.stdin.buffer.read())  # noqa: S301 - from our parent
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415 - only in the child

        tokenizer = Tokenizer.from_str(job["tokenizer_json"])
        answer: tuple[str, Any] = (
            "ok",
            read(
                job["filename"],
                job["kind"],
                job["data"],
                max_pages=job["max_pages"],
                encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
                max_input_tokens=job["max_input_tokens"],
            ),
        )
    except DocumentError as exc:
        answer = ("document", str(exc))
    except Exception as exc:  # noqa: BLE001 - the file's failure, reported by name
        answer = ("error", type(exc).__name__)
    sys.stdout.buffer.write(pickle.dumps(answer))
    sys.stdout.buffer.flush()
