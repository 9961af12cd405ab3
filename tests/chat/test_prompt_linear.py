"""The next turn's prompt in linear time: the same ids as the per-prefix renderer, a bounded
number of template renders per message, and only the newest turns rendered when the history
is longer than the context."""

from __future__ import annotations

import random

import pytest

from conversations.chat.prompts import CUT_TARGET, NeedEarlierHistory, build_prompt, chat_messages
from inference import PromptTooLongError
from inference.prompt import encode_segments
from inference.tokenizer import Tokenizer
from tests.support.prompt_reference import per_prefix_segments


def reference_build_prompt(tokenizer, system_prompt, history, max_model_len, max_tokens):
    """The builder's cut rendered the slow way: every prefix of the history, every pass. The
    fewest oldest turns dropped to fit; once something was dropped, more go until the history
    takes at most ``CUT_TARGET`` of its room (the last turn always stays)."""
    reserve = max(1, min(max_tokens, max_model_len // 4))
    budget = max_model_len - reserve
    start, ids = _reference_cut(tokenizer, system_prompt, history, budget, budget, 0)
    if start:
        target = int(budget * CUT_TARGET)
        start, ids = _reference_cut(tokenizer, system_prompt, history, target, budget, start)
    return ids, start


def _reference_cut(tokenizer, system_prompt, history, budget, hard, start):
    turn_starts = [i for i, item in enumerate(history) if item["role"] == "user"] or [0]
    offset = 1 if system_prompt else 0
    while True:
        encoding = per_prefix_segments(tokenizer, chat_messages(system_prompt, history[start:]))
        ids = encoding.token_ids
        if len(ids) <= budget:
            return start, ids
        later = [s for s in turn_starts if s > start]
        if not later:
            if len(ids) <= hard:
                return start, ids
            raise PromptTooLongError(len(ids), hard)
        chosen = later[0]
        if encoding.exact:
            excess = len(ids) - budget
            for candidate in later:
                chosen = candidate
                segments = encoding.segments[offset : offset + candidate - start]
                if sum(len(seg) for seg in segments) >= excess:
                    break
        start = chosen


def conversation(tokenizer, turns: int, seed: int = 0, reasoning_every: int = 0) -> list[dict]:
    """A history as the chat stores it: user segments and generated answers with their ids
    (some odd: ending on end-of-turn, tokenised character by character), some without."""
    rng = random.Random(seed)
    words = ["lighthouse", "keeper", " 🌊", "naïve", "日本", "\n\n", "  x", "ok!", "sea-", "fog"]
    history: list[dict] = []
    for i in range(turns):
        question = f"Q{i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        history.append({"role": "user", "content": question, "token_ids": None})
        answer = f"A{i} " + "".join(rng.choice(words) for _ in range(rng.randint(0, 15)))
        kind = rng.randint(0, 3)
        if kind == 0:
            ids = None
        elif kind == 1:
            ids = tokenizer.encode(answer) + tokenizer.eos_token_ids[:1]
        elif kind == 2:
            ids = [t for ch in answer for t in tokenizer.encode(ch)]
        else:
            ids = tokenizer.encode(answer)
        item = {"role": "assistant", "content": answer, "token_ids": ids}
        if reasoning_every and i % reasoning_every == 0:
            item["reasoning"] = "thinking it over"
            item["token_ids"] = tokenizer.encode("<think>thinking it over</think>" + answer)
        history.append(item)
    history.append({"role": "user", "content": "And the last question?", "token_ids": None})
    return history


def with_user_segments(tokenizer, system_prompt: str, history: list[dict]) -> list[dict]:
    """The user segments the chat would have stored turn by turn."""
    messages = chat_messages(system_prompt, history)
    segments = per_prefix_segments(tokenizer, messages).segments
    offset = 1 if system_prompt else 0
    for i, item in enumerate(history[:-1]):
        if item["role"] == "user" and i % 3:
            item["token_ids"] = segments[offset + i]
    return history


class CountingTokenizer(Tokenizer):
    """A real tokenizer that counts the messages its chat template is asked to render."""

    rendered = 0

    def apply_chat_template(self, messages, add_generation_prompt=True):
        self.rendered += len(messages)
        return super().apply_chat_template(messages, add_generation_prompt)


@pytest.fixture
def counting(tokenizer) -> CountingTokenizer:
    return CountingTokenizer(tokenizer.hf)


@pytest.mark.parametrize("system_prompt", ["", "Be brief."])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_linear_segments_equal_the_per_prefix_segments(tokenizer, system_prompt, generation_prompt):
    for seed in range(3):
        history = with_user_segments(tokenizer, system_prompt, conversation(tokenizer, 25, seed, 4))
        messages = chat_messages(system_prompt, history)
        expected = per_prefix_segments(tokenizer, messages, generation_prompt)
        assert encode_segments(tokenizer, messages, generation_prompt) == expected


@pytest.mark.parametrize("system_prompt", ["", "You answer questions about the sea."])
@pytest.mark.parametrize("reasoning_every", [0, 3])
def test_the_prompt_of_a_50_message_conversation_is_what_the_previous_builder_made(
    tokenizer, system_prompt, reasoning_every
):
    history = conversation(tokenizer, 25, seed=7, reasoning_every=reasoning_every)
    history = with_user_segments(tokenizer, system_prompt, history)
    assert len(history) == 51
    ids, dropped = reference_build_prompt(tokenizer, system_prompt, history, 4096, 256)
    plan = build_prompt(tokenizer, system_prompt, history, 4096, 256)
    assert (plan.token_ids, plan.dropped) == (ids, dropped) and dropped == 0
    # Token for token what the chat template writes for the whole history.
    plain = [{"role": m["role"], "content": m["content"]} for m in chat_messages(system_prompt, history)]
    assert tokenizer.decode(plan.token_ids, skip_special_tokens=False) == tokenizer.apply_chat_template(plain)
    if not reasoning_every:
        fresh = [{k: v for k, v in item.items() if k != "token_ids"} for item in history]
        text_only = build_prompt(tokenizer, system_prompt, fresh, 4096, 256).token_ids
        assert text_only == tokenizer.encode(tokenizer.apply_chat_template(plain))


@pytest.mark.parametrize("system_prompt", ["", "System."])
@pytest.mark.parametrize("max_model_len", [384, 700, 1500])
def test_a_cut_history_starts_where_the_previous_builder_cut_it(tokenizer, system_prompt, max_model_len):
    for seed in range(3):
        history = with_user_segments(tokenizer, system_prompt, conversation(tokenizer, 60, seed, 5))
        ids, dropped = reference_build_prompt(tokenizer, system_prompt, history, max_model_len, 128)
        plan = build_prompt(tokenizer, system_prompt, history, max_model_len, 128)
        assert (plan.token_ids, plan.dropped) == (ids, dropped) and dropped > 0


def test_building_a_prompt_renders_each_message_a_bounded_number_of_times(counting):
    counts = []
    for turns in (200, 400):
        history = conversation(counting, turns, seed=1)
        counting.rendered = 0
        build_prompt(counting, "Be brief.", history, 1_000_000, 256)
        counts.append(counting.rendered)
    # Linear: twice the messages, about twice the rendering (the per-prefix way: four times).
    assert counts[1] <= 2.2 * counts[0]
    assert counts[1] <= 6 * (2 * 400 + 2)


def test_only_the_newest_turns_are_rendered_when_the_history_outgrows_the_context(counting):
    counts, plans = [], []
    for turns in (1_000, 4_000):
        history = conversation(counting, turns, seed=2)
        counting.rendered = 0
        plans.append(build_prompt(counting, "Be brief.", history, 2048, 256))
        counts.append(counting.rendered)
    assert counts[1] <= 1.2 * counts[0]  # the cost follows the context, not the history
    assert all(len(plan.token_ids) <= 2048 - 256 for plan in plans)
    text = counting.decode(plans[1].token_ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ")
    assert text.endswith("And the last question?<|im_end|>\n<|im_start|>assistant\n")
    assert plans[1].dropped > 7_000 and plans[1].dropped % 2 == 0  # whole turns


def test_the_system_prompt_and_last_message_alone_must_fit_and_nothing_else(tokenizer):
    system = "You are a careful assistant. " * 20
    history = conversation(tokenizer, 300, seed=3)
    plan = build_prompt(tokenizer, system, history, 1024, 128)
    assert plan.dropped > 0 and plan.shared_prefix_tokens > 100  # the system prompt is kept
    assert plan.token_ids[: plan.shared_prefix_tokens] == tokenizer.encode(
        f"<|im_start|>system\n{system}<|im_end|>\n"
    )
    history[-1]["content"] = "word " * 900  # fits the context alone, not with the system prompt
    assert len(build_prompt(tokenizer, "", [history[-1]], 1024, 64).token_ids) <= 1024 - 64
    with pytest.raises(PromptTooLongError):
        build_prompt(tokenizer, system, history, 1024, 64)


def test_messages_left_unread_are_asked_for_only_when_the_newer_ones_may_all_fit(tokenizer):
    history = conversation(tokenizer, 200, seed=4)
    full = build_prompt(tokenizer, "S.", history, 1024, 128)
    tail = history[100:]
    assert tail[0]["role"] == "user"
    plan = build_prompt(tokenizer, "S.", tail, 1024, 128, earlier=100)
    assert (plan.token_ids, plan.dropped) == (full.token_ids, full.dropped)
    with pytest.raises(NeedEarlierHistory):
        build_prompt(tokenizer, "S.", history[-5:], 1024, 128, earlier=len(history) - 5)


def odd_tokenizer(tokenizer, template: str) -> Tokenizer:
    from copy import deepcopy

    hf = deepcopy(tokenizer.hf)
    hf.chat_template = template
    return Tokenizer(hf)


LLAMA3_LIKE = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' %}<|start_header_id|>system<|end_header_id|>\n\n"
    "Today is a day.<|eot_id|>{% endif %}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
TRIMMING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LAST_ONLY = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>>{% endif %}"
SEPARATED = (
    "{% for m in messages %}{% if not loop.first %}\n---\n{% endif %}[{{ m['role'] }}] {{ m['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}\n---\n[assistant] {% endif %}"
)


@pytest.mark.parametrize("template", [LLAMA3_LIKE, TRIMMING, LAST_ONLY, SEPARATED])
@pytest.mark.parametrize("system_prompt", ["", "Sys."])
def test_other_templates_get_the_same_ids_as_the_per_prefix_renderer(tokenizer, template, system_prompt):
    odd = odd_tokenizer(tokenizer, template)
    history = conversation(odd, 12, seed=5)
    history[3]["content"] = "  padded answer  "  # the trimming template changes it
    messages = chat_messages(system_prompt, history)
    assert encode_segments(odd, messages) == per_prefix_segments(odd, messages)
    for max_model_len in (4096, 160):
        expected = reference_build_prompt(odd, system_prompt, history, max_model_len, 32)
        plan = build_prompt(odd, system_prompt, history, max_model_len, 32)
        assert (plan.token_ids, plan.dropped) == expected
