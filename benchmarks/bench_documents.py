"""Documents: retrieval recall, ingestion speed, a document's KV kept warm, exact search at scale.

On the five documents and 38 questions of ``tests/data/documents`` (original texts written
for this repository), with the served model (default SmolLM2-135M-Instruct) as the embedder,
through the same functions the site uses (extraction, chunking, ranking, prompt rendering),
without Django:

- *recall@5*: a question is answered when one of its top five chunks, ranked over the whole
  library (every document's chunks), contains its expected passage: BM25 alone, dense
  vectors alone, and the two fused by reciprocal rank (hybrid, what the chat uses).
- *ingestion*: the documents as PDFs (written by ``tests.support.minimal_pdf``) and DOCX,
  extracted and chunked, in pages per second; then the chunks embedded (tokens per second),
  and the whole path in pages per second.
- *time to first token*: a document of about 3,000 tokens (1,000 with --quick) whole at the start of the system
  message (as the chat puts it), salted in one user's namespace: the first question, then a
  second question in another conversation attaching it, and the next turn of the first.
- *exact search*: numpy's dot product and partial sort over 100,000 (and 10,000) random
  normalised vectors of the model's width, per query.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.bench_documents [--quick] [--model PATH] [--json out.json]

Printed (and written with --json); no figure is asserted. A shared machine makes the seconds noisy.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from pathlib import Path

import numpy as np

from conversations.documents.chunking import Chunk, chunk_text
from conversations.documents.extract import extract
from conversations.documents.formats import kind_of
from conversations.documents.ranking import bm25_ranking, dense_ranking, reciprocal_rank_fusion
from conversations.documents.rendering import documents_system_prompt

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "documents"
TOP = 5


def load_corpus(count) -> tuple[dict[str, str], list[tuple[str, Chunk]]]:
    texts, chunks = {}, []
    for path in sorted(DATA.iterdir()):
        if path.suffix == ".json":
            continue
        texts[path.name] = extract(path.name, kind_of(path.name), path.read_bytes(), max_pages=1000).text
        chunks += [(path.name, c) for c in chunk_text(texts[path.name], count=count)]
    return texts, chunks


def chunk_input(chunk: Chunk) -> str:
    return f"{chunk.heading}\n{chunk.text}".strip()  # what the site embeds and ranks


def recall(engine, chunks: list[tuple[str, Chunk]], vectors: np.ndarray) -> dict:
    questions = json.loads((DATA / "questions.json").read_text())
    texts = [chunk_input(c) for _, c in chunks]
    query_vectors = engine.embed([engine.tokenizer.encode(q["question"]) for q in questions]).numpy()
    hits = {"bm25": 0, "dense": 0, "hybrid": 0}
    for q, qv in zip(questions, query_vectors, strict=True):
        bm25 = bm25_ranking(q["question"], texts)
        dense = dense_ranking(qv, vectors)
        ranked = {"bm25": bm25, "dense": dense, "hybrid": reciprocal_rank_fusion([bm25, dense])}
        for name, order in ranked.items():
            if any(q["expected"] in chunks[i][1].text for i in order[:TOP]):
                hits[name] += 1
    return {name: hits[name] / len(questions) for name in hits} | {"questions": len(questions)}


def ingestion(texts: dict[str, str], count, engine, chunks) -> dict:
    import docx

    from tests.support.minimal_pdf import make_pdf

    pdfs = {name: make_pdf(text) for name, text in texts.items()}
    started = time.perf_counter()
    pages = 0
    for name, data in pdfs.items():
        extracted = extract(name + ".pdf", "pdf", data, max_pages=1000)
        chunk_text(extracted.text, count=count)
        pages += extracted.pages
    pdf_s = time.perf_counter() - started
    docx_files = {}
    for name, text in texts.items():
        document = docx.Document()
        for paragraph in text.split("\n\n"):
            document.add_paragraph(paragraph)
        out = io.BytesIO()
        document.save(out)
        docx_files[name] = out.getvalue()
    started = time.perf_counter()
    for name, data in docx_files.items():
        chunk_text(extract(name + ".docx", "docx", data, max_pages=1000).text, count=count)
    docx_s = time.perf_counter() - started
    inputs = [engine.tokenizer.encode(chunk_input(c)) for _, c in chunks]
    started = time.perf_counter()
    vectors = engine.embed(inputs).numpy()
    embed_s = time.perf_counter() - started
    tokens = sum(len(x) for x in inputs)
    return {
        "pdf_pages": pages,
        "pdf_pages_per_s": pages / pdf_s,
        "docx_docs_per_s": len(docx_files) / docx_s,
        "chunks": len(chunks),
        "embed_tokens": tokens,
        "embed_tokens_per_s": tokens / embed_s,
        "end_to_end_pages_per_s": pages / (pdf_s + embed_s),
        "vectors": vectors,
    }


def first_token_s(engine, prompt: list[int], request_id: str) -> tuple[float, int]:
    from inference import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1)
    started = time.perf_counter()
    request = engine.add_request(prompt, params, request_id, cache_namespace="user:1")
    while engine.has_unfinished():
        if any(d.request_id == request_id and d.token_ids for d in engine.step()):
            break
    elapsed = time.perf_counter() - started
    while engine.has_unfinished():
        engine.step()
    return elapsed, request.num_cached_tokens


def warm_document(engine, texts: dict[str, str], target_tokens: int) -> dict:
    tokenizer = engine.tokenizer
    ids = tokenizer.encode("\n\n".join(texts[n] for n in ("lighthouse_keeping.md", "water_treatment.txt")))
    document = tokenizer.decode(ids[:target_tokens])
    system = documents_system_prompt([("manual.md", document)], "")
    q1, q2 = "How often is the horn sounded in fog?", "How are the sand filters cleaned?"
    first = tokenizer.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": q1}])
    first_s, first_cached = first_token_s(engine, first, "first")
    other = tokenizer.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": q2}])
    other_s, other_cached = first_token_s(engine, other, "other-conversation")
    turn = [
        {"role": "system", "content": system},
        {"role": "user", "content": q1},
        {"role": "assistant", "content": "Twice every minute."},
        {"role": "user", "content": q2},
    ]
    next_s, next_cached = first_token_s(engine, tokenizer.encode_chat(turn), "next-turn")
    return {
        "document_tokens": len(tokenizer.encode(document)),
        "prompt_tokens": len(first),
        "cached_tokens_first_other_next": [first_cached, other_cached, next_cached],
        "first_ttft_s": first_s,
        "second_question_other_conversation_ttft_s": other_s,
        "next_turn_ttft_s": next_s,
        "other_over_first": other_s / first_s,
        "next_turn_over_first": next_s / first_s,
    }


def exact_search(width: int, sizes: list[int], queries: int) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for n in sizes:
        matrix = rng.standard_normal((n, width), dtype=np.float32)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        times = []
        for q in rng.standard_normal((queries, width), dtype=np.float32):
            started = time.perf_counter()
            dense_ranking(q / np.linalg.norm(q), matrix, depth=50)
            times.append(time.perf_counter() - started)
        out[f"{n}_chunks_ms"] = 1000 * statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 1,000-token document, fewer search repeats")
    parser.add_argument(
        "--model", default=None, help="an HF directory or .gguf (default SmolLM2-135M-Instruct)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from inference import EngineConfig, LLMEngine

    engine = LLMEngine(EngineConfig(model=args.model, kv_cache_gb=0.5, num_threads=args.threads))
    count = lambda text: len(engine.tokenizer.encode(text))  # noqa: E731
    texts, chunks = load_corpus(count)
    ingest = ingestion(texts, count, engine, chunks)
    vectors = ingest.pop("vectors")
    results = {
        "model": engine.model_name,
        "recall_at_5": recall(engine, chunks, vectors),
        "ingestion": ingest,
        "warm_document": warm_document(engine, texts, 1000 if args.quick else 3000),
        "exact_search": exact_search(vectors.shape[1], [10_000, 100_000], 10 if args.quick else 50),
    }
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    engine.close()


if __name__ == "__main__":
    main()
