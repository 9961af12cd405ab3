"""Chat encoding keeps turn N's ids as an exact prefix of turn N+1's; the streaming
detokenizer never emits half a character."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.prompt import encode_segments
from inference.tokenizer import Tokenizer
from tests.support.fakes import smollm2_tokenizer_dir

IM_END = 2


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


def char_by_char(tok: Tokenizer, text: str) -> list[int]:
    """A valid but non-canonical tokenisation, like a model may sample."""
    return [tid for ch in text for tid in tok.encode(ch)]


def test_eos_ids_include_end_of_turn_tokens(tok: Tokenizer) -> None:
    assert tok.eos_token_ids[0] == IM_END
    assert tok.hf.convert_tokens_to_ids("<|endoftext|>") in tok.eos_token_ids


def test_encode_chat_matches_template_text(tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
    ids = tok.encode_chat(messages)
    assert tok.decode(ids, skip_special_tokens=False) == tok.apply_chat_template(messages)
    generation_prompt = encode_segments(tok, messages).generation_prompt
    assert ids[-len(generation_prompt) :] == generation_prompt
    assert tok.decode(generation_prompt, skip_special_tokens=False) == "<|im_start|>assistant\n"


def test_encode_chat_prefix_property_over_three_turns_with_stored_ids(tok: Tokenizer) -> None:
    messages: list[dict] = [{"role": "user", "content": "What is the capital of France?"}]
    prompt1 = tok.encode_chat(messages)
    # Turn 1's answer ends with <|im_end|> (stopped on EOS) and is tokenised oddly.
    gen1 = char_by_char(tok, "Paris.") + [IM_END]
    messages.append({"role": "assistant", "content": "Paris.", "token_ids": gen1})
    messages.append({"role": "user", "content": "And of Japan? 日本"})
    prompt2 = tok.encode_chat(messages)
    assert prompt2[: len(prompt1) + len(gen1)] == prompt1 + gen1

    # Turn 2's answer stopped on max_tokens: no end-of-turn token was generated.
    gen2 = tok.encode("Tokyo, the capital")
    messages.append({"role": "assistant", "content": "Tokyo, the capital", "token_ids": gen2})
    messages.append({"role": "user", "content": "Thanks 👍"})
    prompt3 = tok.encode_chat(messages)
    assert prompt3[: len(prompt2) + len(gen2)] == prompt2 + gen2
    # The template's end-of-turn is supplied after the truncated answer.
    assert prompt3[len(prompt2) + len(gen2)] == IM_END
    # The whole prompt still spells exactly what the template renders.
    assert tok.decode(prompt3, skip_special_tokens=False) == tok.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in messages]
    )


def test_stored_user_segment_ids_are_used_verbatim(tok: Tokenizer) -> None:
    messages: list[dict] = [{"role": "user", "content": "hello"}]
    fresh = encode_segments(tok, messages)
    stored = [5, 6, 7]  # whatever the caller stored for that turn is trusted as is
    messages[0]["token_ids"] = stored
    assert tok.encode_chat(messages) == stored + fresh.generation_prompt


def test_template_without_prefix_property_falls_back_to_whole_render(tok: Tokenizer) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    # Shows only the last message: earlier renders are not prefixes of later ones.
    hf.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>>{% endif %}"
    odd = Tokenizer(hf)
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two", "token_ids": [1, 2, 3]},
        {"role": "user", "content": "three"},
    ]
    encoding = encode_segments(odd, messages)
    assert not encoding.exact
    assert encoding.token_ids == odd.encode("three>>")


MULTIBYTE = "Hi 👋🏽 世界, naïve café — ¿qué tal? 🎉🇯🇵 ok"


def test_detokenizer_holds_back_split_characters(tok: Tokenizer) -> None:
    ids = tok.encode(MULTIBYTE)
    # The case under test must occur: some single token decodes to a partial character.
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    detok = tok.detokenizer()
    deltas = [detok.push(t) for t in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == MULTIBYTE
    assert detok.text_so_far == MULTIBYTE


def test_detokenizer_skips_special_tokens_by_default(tok: Tokenizer) -> None:
    detok = tok.detokenizer()
    text = detok.push_many(tok.encode("Done.") + [IM_END]) + detok.flush()
    assert text == "Done."


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40))
def test_detokenizer_concatenation_equals_decode_of_all(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    detok = tok.detokenizer()
    pieces = [detok.push(t) for t in ids] + [detok.flush()]
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces[:-1]) or "\ufffd" in tok.decode(ids)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20),
            st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", " ", "\n\n", "  x"]),
        ),
        max_size=8,
    )
)
def test_encode_through_the_tokenizers_library_equals_transformers(tok: Tokenizer, parts: list[str]) -> None:
    assert tok._backend is not None  # the fast path is the one under test
    text = "".join(parts)
    assert tok.encode(text) == list(tok.hf.encode(text, add_special_tokens=False))
