"""Grammar compiles run in worker processes that are killed at the time limit, behind a
bounded queue with a per-owner share; a caller that gives up drops a job not yet started."""

from __future__ import annotations

import json
import os
import time

import pytest

from inference.structured import GrammarBusyError, GrammarCompiler, GrammarError, GrammarSpec
from inference.structured.compile_pool import WORKER_NICE, usable_cpus
from inference.tokenizer import Tokenizer
from tests.support.fakes import smollm2_tokenizer_dir

# A pattern xgrammar takes far longer than the limits below to compile (tens of seconds).
SLOW = GrammarSpec.json_schema({"type": "string", "pattern": "^x{20000}$"})


def slow(i: int) -> GrammarSpec:
    return GrammarSpec.json_schema({"type": "string", "pattern": f"^y{{{20000 + i}}}$"})


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir())))


def new_compiler(tokenizer: Tokenizer, **options) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size, **options)


def test_a_compile_past_the_time_limit_is_killed_and_the_pool_serves_the_next(tokenizer) -> None:
    compiler = new_compiler(tokenizer, max_workers=1, time_limit=1.0)
    try:
        compiler.compile(GrammarSpec.regex("warm+"), timeout=60)  # the worker has started
        process = compiler.pool._slots[0].process
        started = time.monotonic()
        with pytest.raises(GrammarError, match="did not compile within 1 s"):
            compiler.compile(SLOW, timeout=60)
        assert time.monotonic() - started < 30  # the limit, not the compile's own tens of seconds
        assert compiler.pool.kills == 1
        assert process.poll() is not None  # the process that ran it is gone, not left compiling
        # The same grammar fails again at once (cached), and a small one compiles in a new worker.
        with pytest.raises(GrammarError, match="did not compile within"):
            compiler.compile(SLOW, timeout=60)
        assert compiler.compile(GrammarSpec.json_schema({"type": "integer"}), timeout=60) is not None
    finally:
        compiler.close()


def test_the_queue_and_each_owners_share_are_bounded(tokenizer) -> None:
    compiler = new_compiler(tokenizer, max_workers=1, max_queue=1, max_per_owner=1, time_limit=60)
    try:
        compiler.submit(slow(0), "alice", bounded=True)
        with pytest.raises(GrammarBusyError, match="per user"):
            compiler.submit(slow(1), "alice", bounded=True)
        compiler.submit(slow(2), "bob", bounded=True)  # running + one queued: the pool is full
        with pytest.raises(GrammarBusyError, match="waiting"):
            compiler.submit(slow(3), "carol", bounded=True)
        # The engine's own submits (requests already admitted) are not refused.
        compiler.submit(slow(4), "carol")
        # A cached grammar needs no room.
        assert compiler.submit(slow(0), "alice", bounded=True) is not None
    finally:
        compiler.close()


def test_a_caller_that_gives_up_drops_a_job_not_yet_started(tokenizer) -> None:
    compiler = new_compiler(tokenizer, max_workers=1, time_limit=60)
    try:
        running = compiler.submit(slow(10), "alice", bounded=True)
        with pytest.raises(GrammarError, match="did not compile within"):
            compiler.compile(GrammarSpec.regex("z+"), timeout=0.2, owner="bob")
        queued = compiler.submit(GrammarSpec.regex("z+"))
        assert not running.done()
        # The cancelled job left the cache: a new submit makes a new job.
        assert queued.cancelled() is False
    finally:
        compiler.close()


def test_schema_source_round_trips_through_the_worker(tokenizer) -> None:
    """A compiled grammar comes back from the worker usable in this process."""
    from inference.structured import SequenceGrammar

    compiler = new_compiler(tokenizer, max_workers=1)
    try:
        spec = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
        future = compiler.submit(spec)
        compiler.compile(spec, timeout=60)
        grammar = SequenceGrammar(future)
        for token in tokenizer.encode(json.dumps({"a": 12})):  # xgrammar's compact JSON: ", " and ": "
            assert grammar.accept(token)
    finally:
        compiler.close()


def test_workers_compile_below_the_servers_priority_and_no_more_than_the_cores(tokenizer) -> None:
    """A compile that runs to its limit yields the cores to the engine thread first, and the
    pool never starts more compiling processes than the server's cores."""
    compiler = new_compiler(tokenizer, max_workers=64)
    try:
        assert compiler.pool.workers == min(64, usable_cpus())
        compiler.compile(GrammarSpec.regex("nice+"), timeout=60)
        process = compiler.pool._slots[0].process
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, process.pid) == min(19, ours + WORKER_NICE)
    finally:
        compiler.close()


def test_prepare_builds_the_tokenizer_data_and_starts_a_worker_before_any_grammar(tokenizer) -> None:
    """A server prepares at start (in the background): the first grammar, perhaps sent while
    streams run, then neither builds xgrammar's tokenizer data in the server process nor
    waits for a worker to load xgrammar."""
    compiler = new_compiler(tokenizer, max_workers=2, time_limit=60)
    try:
        compiler.prepare()
        assert compiler._info is not None
        slots = compiler.pool._slots
        assert len(slots) == 1 and slots[0].process is not None and slots[0].process.poll() is None
        process = slots[0].process
        built = []
        compiler._tokenizer_info = lambda: built.append(1)  # type: ignore[method-assign]
        compiler.pool._info_json = lambda: built.append(1)  # type: ignore[method-assign]
        assert compiler.pool.info()  # the workers' data, already serialised
        assert built == []
        compiler._tokenizer_info = type(compiler)._tokenizer_info.__get__(compiler)  # type: ignore[method-assign]
        assert compiler.compile(GrammarSpec.regex("ab+"), timeout=60) is not None
        assert compiler.pool._slots[0].process is process  # the prepared worker compiled it
    finally:
        compiler.close()
