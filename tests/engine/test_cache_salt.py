"""Prefix-cache privacy (vLLM's cache_salt): salted blocks match only the same salt;
blocks wholly before the salt's start stay shared; multi-turn hits within one salt
are as high as without salting."""

from __future__ import annotations

from inference.engine.sequence import Sequence
from inference.kv.block_manager import BlockManager, salt_hash
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
    shared = len(tok.encode_chat_segments(first).segments[0])  # the system prompt's ids
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
