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


def chat_turns(
    tokenizer, turns: int, max_model_len: int, max_tokens: int = 48, system_prompt: str = "Be brief."
):
    """A chat of ``turns`` turns, each prompt built with the start the previous one kept, as
    the answer path does; returns the history (messages with ids) and each turn's plan."""
    history: list[dict] = []
    plans = []
    start_id = None
    for i in range(turns):
        history.append(
            {"id": 2 * i, **turn("user", f"Question {i}: " + "how far is the lighthouse? " * (i % 4 + 1))}
        )
        plan = build_prompt(tokenizer, system_prompt, history, max_model_len, max_tokens, start_id=start_id)
        history[-1]["token_ids"] = plan.user_segment
        answer = f"Answer {i}: " + "the lamp turns all night. " * (i % 5 + 1)
        history.append(
            {
                "id": 2 * i + 1,
                **turn("assistant", answer, tokenizer.encode(answer) + tokenizer.eos_token_ids[:1]),
            }
        )
        plans.append(plan)
        start_id = plan.start_id
    return history, plans


def test_consecutive_turns_share_the_previous_prompt_as_a_prefix_after_the_context_fills(tokenizer):
    _, plans = chat_turns(tokenizer, 160, 2048)
    filled = next(i for i, plan in enumerate(plans) if plan.dropped)
    pairs = list(zip(plans[filled:], plans[filled + 1 :], strict=False))
    shared = sum(1 for a, b in pairs if b.token_ids[: len(a.token_ids)] == a.token_ids)
    jumps = len(pairs) - shared
    assert len(pairs) > 60 and shared >= 0.8 * len(pairs) and jumps >= 3  # the cut moved, in steps
    assert all(a.dropped <= b.dropped for a, b in zip(plans, plans[1:], strict=False))  # only forward


def test_the_kept_history_always_fits_and_a_new_cut_leaves_a_quarter_free(tokenizer):
    max_model_len, max_tokens = 512, 48
    budget = max_model_len - max_tokens
    _, plans = chat_turns(tokenizer, 120, max_model_len, max_tokens)
    assert all(len(plan.token_ids) <= budget for plan in plans)
    for a, b in zip(plans, plans[1:], strict=False):
        if b.dropped > a.dropped:  # a new cut: down to three quarters of the room
            assert len(b.token_ids) <= budget * 3 / 4 and b.start_id is not None
        assert b.max_tokens == min(max_tokens, max_model_len - len(b.token_ids))


def test_a_conversation_that_fits_keeps_no_start_and_is_cut_as_before(tokenizer):
    _, plans = chat_turns(tokenizer, 6, 4096)
    assert all(plan.dropped == 0 and plan.start_id is None for plan in plans)


def test_a_stored_start_off_the_path_falls_back_to_a_new_cut(tokenizer):
    history, plans = chat_turns(tokenizer, 60, 512)
    start_id = plans[-1].start_id
    question = {"id": 10_000, **turn("user", "And at dawn?")}
    fresh = build_prompt(tokenizer, "Be brief.", [*history, question], 512, 48)
    # An edit before the stored start: the path holds copies with other ids.
    edited = [{**item, "id": item["id"] + 100_000} for item in history]
    plan = build_prompt(tokenizer, "Be brief.", [*edited, question], 512, 48, start_id=start_id)
    assert plan.token_ids == fresh.token_ids and plan.dropped == fresh.dropped
    assert plan.start_id == fresh.start_id + 100_000
    # A start that is not a turn's first message (an answer) is not one to keep either.
    answer_id = history[-1]["id"]
    assert (
        build_prompt(tokenizer, "Be brief.", [*history, question], 512, 48, start_id=answer_id).token_ids
        == fresh.token_ids
    )


def test_a_stored_start_whose_history_no_longer_fits_moves_the_cut_forward(tokenizer):
    history, plans = chat_turns(tokenizer, 60, 512)
    start_id = plans[-1].start_id
    kept = next(i for i, item in enumerate(history) if item["id"] == start_id)
    long_question = {"id": 10_000, **turn("user", "Tell me everything. " * 60)}
    plan = build_prompt(tokenizer, "Be brief.", [*history, long_question], 512, 48, start_id=start_id)
    assert plan.dropped > kept and len(plan.token_ids) <= 512 - 48
    with pytest.raises(PromptTooLongError):  # only when the last turn alone cannot fit
        build_prompt(
            tokenizer,
            "Be brief.",
            [*history, {"id": 1, **turn("user", "x " * 2000)}],
            512,
            48,
            start_id=start_id,
        )
