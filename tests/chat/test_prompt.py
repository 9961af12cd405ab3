"""Prompt building: stored ids reused (a cache hit next turn), whole turns cut when too long."""

from __future__ import annotations

import pytest

from conversations.chat.prompts import build_prompt
from inference import PromptTooLongError


def turn(role: str, content: str, token_ids=None) -> dict:
    return {"role": role, "content": content, "token_ids": token_ids}


def test_next_turn_prompt_starts_with_the_previous_prompt_and_the_generated_ids(tokenizer):
    first = build_prompt(tokenizer, "Be brief.", [turn("user", "Hello")], 2048, 64)
    generated = tokenizer.encode(" Hi  there!") + tokenizer.eos_token_ids[:1]
    history = [
        turn("user", "Hello", first.user_segment),
        turn("assistant", "Hi  there!", generated),
        turn("user", "And now?"),
    ]
    second = build_prompt(tokenizer, "Be brief.", history, 2048, 64)
    assert second.token_ids[: len(first.token_ids) + len(generated)] == first.token_ids + generated
    assert second.dropped == 0


def test_the_users_segment_is_stored_only_where_the_template_adds_nothing_of_its_own(tokenizer):
    # Without a system prompt the first message's segment carries the template's default one.
    assert build_prompt(tokenizer, "", [turn("user", "Hello")], 2048, 64).user_segment is None
    with_system = build_prompt(tokenizer, "Be brief.", [turn("user", "Hello")], 2048, 64)
    assert with_system.user_segment == tokenizer.encode("<|im_start|>user\nHello<|im_end|>\n")


def test_history_longer_than_the_context_is_cut_at_whole_turns_from_the_oldest_end(tokenizer):
    history = []
    for i in range(12):
        history += [
            turn("user", f"question {i} " + "lorem ipsum " * 20),
            turn("assistant", f"answer {i} " * 30),
        ]
    history.append(turn("user", "the last question"))
    plan = build_prompt(tokenizer, "System.", history, 1024, 256)
    assert len(plan.token_ids) <= 1024 - 256
    assert plan.dropped > 0 and plan.dropped % 2 == 0  # pairs: never half a turn
    kept = history[plan.dropped :]
    assert kept[0]["role"] == "user"
    text = tokenizer.decode(plan.token_ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nSystem.")
    assert f"question {plan.dropped // 2} " in text and f"question {plan.dropped // 2 - 1} " not in text
    assert plan.max_tokens == 256


def test_max_tokens_shrinks_to_the_room_left_in_the_context(tokenizer):
    plan = build_prompt(tokenizer, "", [turn("user", "hi " * 100)], 512, 10_000)
    assert plan.max_tokens == 512 - len(plan.token_ids)


def test_a_single_message_longer_than_the_context_is_an_error(tokenizer):
    with pytest.raises(PromptTooLongError):
        build_prompt(tokenizer, "", [turn("user", "word " * 3000)], 1024, 64)


def test_the_chat_salts_each_users_blocks_after_the_shared_system_prompt(tokenizer, settings):
    from conversations.chat.prompts import engine_options

    plan = build_prompt(tokenizer, "Be brief.", [turn("user", "Hello")], 2048, 64)
    system_ids = tokenizer.encode("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert plan.token_ids[: plan.shared_prefix_tokens] == system_ids
    settings.PREFIX_CACHE_SALT = True
    # The user's namespace, from which the engine derives the salt (no salt string of its own).
    assert engine_options(7, plan) == {
        "owner": "user:7",
        "cache_namespace": "user:7",
        "cache_salt_from": len(system_ids),
    }
    assert engine_options(8, plan)["cache_namespace"] != engine_options(7, plan)["cache_namespace"]
    # Without a system prompt the template's own default is not assumed shared.
    assert build_prompt(tokenizer, "", [turn("user", "Hello")], 2048, 64).shared_prefix_tokens == 0


def test_turning_prefix_cache_salting_off_leaves_only_the_fair_share_owner(tokenizer, settings):
    from conversations.chat.prompts import engine_options

    settings.PREFIX_CACHE_SALT = False
    plan = build_prompt(tokenizer, "Be brief.", [turn("user", "Hello")], 2048, 64)
    assert engine_options(7, plan) == {"owner": "user:7"}
