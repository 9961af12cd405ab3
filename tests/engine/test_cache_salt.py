"""Prefix-cache privacy (vLLM's cache_salt): salted blocks match only the same salt;
blocks wholly before the salt's start stay shared; multi-turn hits within one salt
are as high as without salting."""

from __future__ import annotations

from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager, salt_hash
from inference.prompt import encode_segments
from tests.engine.engine_fixtures import TinyModel, greedy
from tests.engine.test_block_manager import BS, admit, run


def salted(tokens: list[int], salt: str | None, from_block: int = 0) -> Sequence:
    seq = Sequence(list(tokens), num_prompt_tokens=len(tokens))
    if salt:
        seq.cache_salt, seq.cache_salt_block = salt_hash(salt), from_block
    return seq


def test_the_same_prompt_with_another_salt_or_none_gets_no_hit() -> None:
    bm = BlockManager(num_blocks=32, block_size=BS)
    tokens = list(range(1, 14))
    admit(bm, a := salted(tokens, "user:1"))
    run(bm, a)
    assert admit(bm, salted(tokens, "user:2")) == 0
    assert admit(bm, salted(tokens, None)) == 0
    assert admit(bm, salted(tokens, "user:1")) == 3


def test_blocks_before_the_salt_start_are_shared_by_every_salt() -> None:
    bm = BlockManager(num_blocks=32, block_size=BS)
    tokens = list(range(1, 14))  # 3 full blocks before the last token
    admit(bm, a := salted(tokens, "user:1", from_block=2))
    run(bm, a)
    assert admit(bm, salted(tokens, "user:2", from_block=2)) == 2
    assert admit(bm, salted(tokens, None)) == 2


def finish(engine, prompt: list[int], max_tokens: int, **options):
    request = engine.add_request(prompt, greedy(max_tokens), **options)
    while engine.has_unfinished():
        engine.step()
    return request


def test_salting_keeps_a_users_multi_turn_hits_and_hides_them_from_other_users(tiny: TinyModel) -> None:
    tok = tiny.tokenizer
    rules = " ".join(f"Rule {i}: answer carefully and in full sentences." for i in range(8))
    first = [
        {"role": "system", "content": f"You are a careful assistant. {rules}"},
        {"role": "user", "content": "Tell me about lighthouses and the keepers who ran them."},
    ]
    shared = len(encode_segments(tok, first).segments[0])  # the system prompt's ids
    bs = tiny.engine().block_manager.block_size
    assert shared >= 2 * bs

    def two_turns(engine, salt: str | None) -> tuple[int, int]:
        options = {"cache_salt": salt, "cache_salt_from": shared}
        prompt1 = tok.encode_chat(first)
        out1 = finish(engine, prompt1, 24, **options).outputs_in_order()[0]
        history = first + [
            {"role": "assistant", "content": out1.output_text, "token_ids": out1.output_token_ids},
            {"role": "user", "content": "And in winter storms?"},
        ]
        turn2 = finish(engine, tok.encode_chat(history), 4, **options)
        return len(prompt1) + out1.num_output_tokens, turn2.num_cached_tokens

    _, plain_hits = two_turns(tiny.engine(), None)
    engine = tiny.engine()
    turn1_len, salted_hits = two_turns(engine, "user:1")
    assert salted_hits == plain_hits == (turn1_len - 1) // bs * bs

    # Another user sending the very same first turn shares only the system prompt's blocks.
    other = finish(engine, tok.encode_chat(first), 2, cache_salt="user:2", cache_salt_from=shared)
    assert other.num_cached_tokens == shared // bs * bs > 0


# ---- namespaces: a caller's salt lives inside its namespace; purges ----------------------------


def system_and_question(tiny: TinyModel, question: str) -> tuple[list[int], int]:
    """A chat prompt whose system prompt fills at least two blocks, and that prompt's length."""
    rules = " ".join(f"Rule {i}: answer carefully and in full sentences." for i in range(8))
    messages = [
        {"role": "system", "content": f"You are a careful assistant. {rules}"},
        {"role": "user", "content": question},
    ]
    encoding = encode_segments(tiny.tokenizer, messages)
    return encoding.token_ids, len(encoding.segments[0])


def test_a_callers_salt_is_nested_in_its_namespace_and_never_matches_another_namespace(
    tiny: TinyModel,
) -> None:
    engine = tiny.engine()
    prompt = tiny.tokenizer.encode("the lighthouse keeper counted the waves " * 8)
    full = (len(prompt) - 1) // engine.block_manager.block_size * engine.block_manager.block_size
    finish(engine, prompt, 2, cache_namespace="user:1")
    # Another namespace gets nothing, whatever salt it names (even the first one's name).
    assert finish(engine, prompt, 1, cache_namespace="user:2", cache_salt="user:1").num_cached_tokens == 0
    assert finish(engine, prompt, 1, cache_namespace="user:2").num_cached_tokens == 0
    assert finish(engine, prompt, 1).num_cached_tokens == 0
    # Inside the namespace, a salt is a cache of its own; no salt is the namespace's cache.
    assert finish(engine, prompt, 1, cache_namespace="user:1", cache_salt="tenant").num_cached_tokens == 0
    assert finish(engine, prompt, 1, cache_namespace="user:1").num_cached_tokens == full
    assert finish(engine, prompt, 1, cache_namespace="user:1", cache_salt="tenant").num_cached_tokens == full


def test_purging_a_namespace_drops_its_blocks_and_keeps_other_users_and_the_system_prompt(
    tiny: TinyModel,
) -> None:
    engine = tiny.engine()
    bs = engine.block_manager.block_size
    prompt, shared = system_and_question(tiny, "Tell me about lighthouses and the keepers who ran them.")
    full = (len(prompt) - 1) // bs * bs
    for user in ("user:1", "user:2"):
        finish(engine, prompt, 4, cache_namespace=user, cache_salt_from=shared)
    assert engine.purge_namespace("user:1") > 0
    again = finish(engine, prompt, 1, cache_namespace="user:1", cache_salt_from=shared)
    assert again.num_cached_tokens == shared // bs * bs > 0  # only the common system prompt
    other = finish(engine, prompt, 1, cache_namespace="user:2", cache_salt_from=shared)
    assert other.num_cached_tokens == full
    bm = engine.block_manager
    assert all(b.ref_count == 0 for b in bm.blocks) and bm.num_free_blocks == bm.num_blocks
    assert engine.purge_namespace("user:3") == 0


def test_a_running_request_of_a_purged_namespace_is_never_served_and_frees_its_blocks_empty(
    tiny: TinyModel,
) -> None:
    engine = tiny.engine()
    bm = engine.block_manager
    prompt = tiny.tokenizer.encode("a private question about the winter storms " * 6)
    running = engine.add_request(prompt, greedy(40), cache_namespace="user:1")
    while running.seqs[0].num_output_tokens < 20:  # prefilled, and decoding
        engine.step()
    root = running.cache_namespace
    assert any(b.namespace == root and b.hash is not None for b in bm.blocks)
    engine.purge_namespace("user:1")
    assert not any(b.namespace == root and b.hash is not None for b in bm.blocks)
    probe = Sequence(list(prompt) + [5], len(prompt) + 1)
    probe.cache_salt, probe.cache_namespace = running.cache_salt, root
    assert bm.match_prefix(probe) == []
    while engine.has_unfinished():  # it goes on, publishing none of its new blocks
        engine.step()
    assert not any(b.namespace == root and b.hash is not None for b in bm.blocks)
    assert bm.stats().cached == 0 and bm.num_free_blocks == bm.num_blocks
