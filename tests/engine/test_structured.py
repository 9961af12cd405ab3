"""Grammar-constrained decoding: the mask, EOS gating, forks, preemption, rollback, the
compile cache, and requests waiting for their grammar without holding others up."""

from __future__ import annotations

import json
from concurrent.futures import Future
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from inference.sampling.params import SamplingParams
from inference.structured import (
    GrammarCompiler,
    GrammarError,
    GrammarSpec,
    SequenceGrammar,
    apply_grammar_masks,
)
from tests.engine.engine_fixtures import greedy, random_prompts, run_to_completion

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "kind": {"enum": ["cat", "dog", "owl"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "kind", "ok", "tags"],
}


@pytest.fixture(scope="module")
def compiler(tiny) -> GrammarCompiler:
    compiler = GrammarCompiler(tiny.tokenizer, tiny.loaded[2].vocab_size)
    yield compiler
    compiler.close()


def _seq(grammar: SequenceGrammar | None) -> SimpleNamespace:
    return SimpleNamespace(grammar=grammar)


def _allowed(logits_row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(logits_row > float("-inf")).flatten().tolist())


def test_compile_cache_and_errors(compiler) -> None:
    spec = GrammarSpec.json_schema(PERSON)
    first = compiler.submit(spec)
    hits = compiler.hits
    assert compiler.submit(GrammarSpec.json_schema(json.loads(json.dumps(PERSON)))) is first
    assert compiler.hits == hits + 1
    assert compiler.submit(GrammarSpec.json_schema({"type": "integer"})) is not first
    compiler.compile(GrammarSpec.ebnf('root ::= "yes" | "no"'), timeout=30)
    for bad in [
        GrammarSpec("json_schema", "{not json"),
        GrammarSpec.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
        GrammarSpec.regex("(unclosed"),
        GrammarSpec.ebnf("root ::= undefined_rule"),
        GrammarSpec.choice([]),
    ]:
        with pytest.raises(GrammarError):
            compiler.compile(bad, timeout=30)


def test_mask_allows_exactly_the_grammars_tokens(compiler, tiny) -> None:
    """Constrained rows keep only tokens the matcher accepts; other rows are untouched."""
    spec = GrammarSpec.choice(["yes", "no", "maybe"])
    grammar = SequenceGrammar(compiler.submit(spec))
    compiler.compile(spec, timeout=30)
    vocab = tiny.loaded[2].vocab_size
    logits = torch.randn(2, vocab)
    before = logits.clone()
    out = apply_grammar_masks(logits, [_seq(None), _seq(grammar)])
    assert torch.equal(out[0], before[0])
    allowed = _allowed(out[1])
    assert allowed and len(allowed) < 50
    assert torch.equal(out[1][sorted(allowed)], before[1][sorted(allowed)])
    matcher = grammar.get_matcher()
    for token in range(vocab):  # exhaustive: the mask is exactly the matcher's verdict
        probe = matcher.fork()
        assert probe.accept_token(token) == (token in allowed), token


def test_eos_only_where_the_grammar_accepts(compiler, tiny) -> None:
    tokenizer = tiny.tokenizer
    spec = GrammarSpec.regex("ab(c)?")
    grammar = SequenceGrammar(compiler.submit(spec))
    compiler.compile(spec, timeout=30)
    vocab = tiny.loaded[2].vocab_size
    eos = set(tokenizer.eos_token_ids)

    def allowed() -> set[int]:
        return _allowed(apply_grammar_masks(torch.zeros(1, vocab), [_seq(grammar)])[0])

    assert not allowed() & eos
    for token in tokenizer.encode("ab"):
        assert grammar.accept(token)
    assert eos <= allowed()  # "ab" is complete: it may end (or go on with "c")
    assert grammar.accept(tokenizer.encode("c")[0])
    assert allowed() == eos  # nothing but the end remains


def test_rollback_restores_the_mask(compiler, tiny) -> None:
    spec = GrammarSpec.json_schema(PERSON)
    grammar = SequenceGrammar(compiler.submit(spec))
    compiler.compile(spec, timeout=30)
    vocab = tiny.loaded[2].vocab_size
    tokens = tiny.tokenizer.encode('{"name": "Al", "kind": "')
    mask = lambda: apply_grammar_masks(torch.zeros(1, vocab), [_seq(grammar)])[0]  # noqa: E731
    for token in tokens[:3]:
        assert grammar.accept(token)
    at_three = mask()
    for token in tokens[3:]:
        assert grammar.accept(token)
    assert not torch.equal(mask(), at_three)
    grammar.rollback(len(tokens) - 3)
    assert torch.equal(mask(), at_three)
    # A fork is independent of its parent.
    child = grammar.fork()
    assert child.accept(tokens[3])
    assert torch.equal(mask(), at_three)
    # A replayed state equals one that followed the tokens.
    replayed = SequenceGrammar.replay(grammar.compiled, tokens[:3])
    assert torch.equal(apply_grammar_masks(torch.zeros(1, vocab), [_seq(replayed)])[0], at_three)


def _check_person(text: str) -> None:
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.smoke
def test_sampled_outputs_match_the_schema(tiny) -> None:
    """Random weights at temperature 1: every completion (n = 3) is schema-valid and
    ends by EOS, because the mask leaves nothing else."""
    engine = tiny.engine()
    params = SamplingParams(
        n=3, temperature=1.0, max_tokens=200, seed=7, grammar=GrammarSpec.json_schema(PERSON)
    )
    outs = run_to_completion(engine, random_prompts(tiny.tokenizer, 4, seed=1), params)
    for out in outs:
        assert len(out.outputs) == 3
        for completion in out.outputs:
            assert completion.finish_reason == "stop", completion.text
            _check_person(completion.text)


def test_beam_search_under_a_grammar(tiny) -> None:
    engine = tiny.engine()
    choices = ["alpha", "beta", "gamma delta"]
    params = SamplingParams(
        n=2, use_beam_search=True, temperature=0.0, max_tokens=12, grammar=GrammarSpec.choice(choices)
    )
    out = run_to_completion(engine, random_prompts(tiny.tokenizer, 1, seed=3), params)[0]
    assert [c.text in choices for c in out.outputs] == [True, True]


def test_other_rows_keep_their_greedy_tokens(tiny) -> None:
    """Unconstrained requests sharing the batch decode exactly as without the grammar ones."""
    prompts = random_prompts(tiny.tokenizer, 6, seed=4)
    alone = run_to_completion(tiny.engine(), prompts[:3], greedy(12))
    mixed_params = [greedy(12)] * 3 + [
        SamplingParams(temperature=1.0, max_tokens=60, grammar=GrammarSpec.json_schema(PERSON))
    ] * 3
    mixed = run_to_completion(tiny.engine(), prompts, mixed_params)
    assert [o.token_ids for o in mixed[:3]] == [o.token_ids for o in alone]


def test_grammar_state_survives_preemption(tiny) -> None:
    """A pool too small for all requests preempts (recompute); constrained greedy output
    is the same token for token as with a pool that never preempts."""
    prompts = random_prompts(tiny.tokenizer, 6, seed=5, min_len=20, max_len=40)
    params = SamplingParams(temperature=0.0, max_tokens=48, grammar=GrammarSpec.json_schema(PERSON))
    roomy = run_to_completion(tiny.engine(), prompts, params)
    small = tiny.engine(num_kv_blocks=20)
    tight = run_to_completion(small, prompts, params)
    assert small.scheduler.num_preemptions > 0
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
    for out in tight:
        if out.outputs[0].finish_reason == "stop":
            _check_person(out.text)


def test_compiling_request_does_not_hold_up_the_batch(tiny) -> None:
    """A request whose grammar is still compiling is skipped; others run past it; it
    starts once compiled. A grammar that fails ends its request without output."""
    engine = tiny.engine()
    pending: Future = Future()
    failing: Future = Future()
    real_submit = engine.grammars.submit
    futures = iter([pending, failing])
    engine.grammars.submit = lambda spec: next(futures)  # type: ignore[method-assign]
    spec = GrammarSpec.json_schema(PERSON)
    prompts = random_prompts(tiny.tokenizer, 3, seed=6)
    slow = engine.add_request(prompts[0], SamplingParams(max_tokens=40, grammar=spec), request_id="slow")
    broken = engine.add_request(prompts[1], SamplingParams(max_tokens=40, grammar=spec), request_id="broken")
    free = engine.add_request(prompts[2], greedy(8), request_id="free")
    while not free.is_finished:
        engine.step()
    assert slow.seqs[0].num_output_tokens == 0 and slow.seqs[0].num_computed_tokens == 0
    failing.set_exception(GrammarError("bad"))
    pending.set_result(real_submit(spec).result(30))
    while engine.has_unfinished():
        engine.step()
    _check_person(engine.request_output(slow).text)
    assert engine.request_output(broken).outputs[0].token_ids in (
        [],
        *[[t] for t in tiny.tokenizer.eos_token_ids],
    )


def test_bounded_strings_keep_control_characters_out(compiler, tiny) -> None:
    """Inside a maxLength string xgrammar's own mask admits raw control characters (not
    JSON); the compiler's extra bits keep every token holding one out."""
    spec = GrammarSpec.json_schema({"type": "string", "minLength": 2, "maxLength": 4})
    grammar = SequenceGrammar(compiler.submit(spec))
    compiler.compile(spec, timeout=30)
    assert grammar.accept(tiny.tokenizer.encode('"')[0])
    vocab = tiny.loaded[2].vocab_size
    allowed = _allowed(apply_grammar_masks(torch.zeros(1, vocab), [_seq(grammar)])[0])
    hf = tiny.tokenizer.hf
    controls = {t for t in range(len(hf)) if any(ord(c) < 0x20 for c in hf.decode([t]))}
    assert controls and not allowed & controls
    assert tiny.tokenizer.encode("ab")[0] in allowed
    # The grammar itself would have allowed one (the gap the extra bits close).
    assert grammar.get_matcher().fork().accept_string("\x1b")


def test_mask_comes_before_penalties_top_k_and_top_p(tiny) -> None:
    """top-k 1 / a tiny top-p / strong penalties act on the allowed tokens only: were the
    mask applied after them, the single kept token would mostly be a forbidden one."""
    engine = tiny.engine()
    choices = ["north", "south", "east west"]
    params = [
        SamplingParams(temperature=1.0, top_k=1, max_tokens=10, grammar=GrammarSpec.choice(choices)),
        SamplingParams(temperature=1.0, top_p=0.01, max_tokens=10, grammar=GrammarSpec.choice(choices)),
        SamplingParams(
            temperature=1.0,
            repetition_penalty=5.0,
            presence_penalty=2.0,
            max_tokens=10,
            seed=3,
            grammar=GrammarSpec.choice(choices),
        ),
    ]
    outs = run_to_completion(engine, random_prompts(tiny.tokenizer, 3, seed=8), params)
    assert [o.text in choices for o in outs] == [True, True, True]
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)


def test_speculation_leaves_constrained_rows_valid(tiny) -> None:
    """With n-gram speculation on, a repetitive prompt's greedy tokens are unchanged and a
    grammar-constrained request in the same batch (decoded without speculation) stays valid."""
    loop = [5, 9, 13, 17, 21, 25, 29, 33] * 6
    prompts = [loop, random_prompts(tiny.tokenizer, 1, seed=9)[0]]
    constrained = SamplingParams(
        temperature=1.0, max_tokens=200, seed=3, grammar=GrammarSpec.json_schema(PERSON)
    )
    plain = run_to_completion(tiny.engine(), [loop], greedy(24))[0]
    engine = tiny.engine(speculative="ngram")
    outs = run_to_completion(engine, prompts, [greedy(24), constrained])
    assert outs[0].token_ids == plain.token_ids
    assert outs[1].outputs[0].finish_reason == "stop"
    _check_person(outs[1].outputs[0].text)
