"""``inference.prompt``: every template's prompt ids are those of the per-prefix definition
(``tests.support.prompt_reference``) for long histories, stored answers and tool calls, in a
number of template renders linear in the messages; ``/v1`` encodes any number of messages so."""

from __future__ import annotations

import asyncio
import random
from copy import deepcopy
from types import SimpleNamespace

import pytest

from inference.prompt import encode_chat, encode_segments
from inference.tokenizer import Tokenizer
from inference.tools.formats import HermesFormat, Llama3Format
from tests.chat.test_prompt_linear import LAST_ONLY, LLAMA3_LIKE, SEPARATED, TRIMMING
from tests.support.fakes import R1_STYLE_TEMPLATE, smollm2_tokenizer_dir
from tests.support.prompt_reference import per_prefix_segments
from tests.support.tool_model import TOOL_TEMPLATE

LLAMA31_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Mistral's v1 shape: turns must alternate (user first), contents trimmed, no system role.
MISTRAL_LIKE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('alternate') }}{% endif %}"
    "{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + m['content'] | trim + eos_token }}{% endif %}{% endfor %}"
)
JSON_LINES = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | tojson }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
# Qwen3's shape: answers before the last question lose their reasoning.
STRIPS_OLD_REASONING = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last and '</think>' in c %}"
    "{% set c = c.split('</think>')[-1] %}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ c }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {
    "smollm2": None,
    "llama3": LLAMA3_LIKE,
    "llama3.1": LLAMA31_LIKE,
    "mistral": MISTRAL_LIKE,
    "trimming": TRIMMING,
    "separated": SEPARATED,
    "json": JSON_LINES,
    "r1": R1_STYLE_TEMPLATE,
}
# Templates whose turns end on one of the tokenizer's special tokens (ChatML's): the whole
# render tokenises to the same ids.
SPECIAL_BOUNDARIES = ("smollm2", "trimming", "r1")
WORDS = ["lighthouse", "keeper", " 🌊", "naïve", "日本", "\n\n", "  x", "ok!", "sea-", "fog", '"q"', "\\n"]


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


def with_template(tokenizer: Tokenizer, template: str | None) -> Tokenizer:
    if template is None:
        return tokenizer
    hf = deepcopy(tokenizer.hf)
    hf.chat_template = template
    return Tokenizer(hf)


def history(tokenizer: Tokenizer, messages: int, seed: int, system: bool = True) -> list[dict]:
    """Alternating questions and answers, padded and unpadded, answers with the ids a model
    may have generated (canonical, ending on end-of-turn, character by character) or none."""
    rng = random.Random(seed)
    out = [{"role": "system", "content": "Be brief. "}] if system else []
    for i in range(messages):
        text = f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 10)))
        text = rng.choice(["", " ", "\n"]) + text + rng.choice(["", " ", "\n"])
        if i % 2:
            kind = rng.randint(0, 3)
            ids = [
                None,
                tokenizer.encode(text),
                tokenizer.encode(text) + tokenizer.eos_token_ids[:1],
                [t for ch in text for t in tokenizer.encode(ch)],
            ][kind]
            out.append({"role": "assistant", "content": text, **({"token_ids": ids} if ids else {})})
        else:
            out.append({"role": "user", "content": text})
    return out


def store_user_segments(tokenizer: Tokenizer, messages: list[dict]) -> list[dict]:
    """User segments as the chat stores them, on every third question after the first."""
    segments = per_prefix_segments(tokenizer, messages).segments
    stored = [dict(m) for m in messages]
    for i, message in enumerate(stored):
        if i > 1 and message["role"] == "user" and i % 3 == 0:
            message["token_ids"] = segments[i]
    return stored


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_every_template_gets_the_per_prefix_ids_for_hundreds_of_messages(smollm2, name):
    tok = with_template(smollm2, TEMPLATES[name])
    system = name != "mistral"
    messages = store_user_segments(tok, history(tok, 301, seed=len(name), system=system))
    for generation_prompt in (True, False):
        expected = per_prefix_segments(tok, messages, generation_prompt)
        assert encode_segments(tok, messages, generation_prompt) == expected
        assert expected.exact
    # Without stored ids (which hold what the model generated, untrimmed, with its own
    # end-of-turn token): token for token what the template writes for the whole conversation.
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    ids = encode_chat(tok, plain)
    assert tok.decode(ids, skip_special_tokens=False) == tok.apply_chat_template(plain)
    if name in SPECIAL_BOUNDARIES:
        assert ids == tok.encode(tok.apply_chat_template(plain))


@pytest.mark.parametrize("template", [LAST_ONLY, STRIPS_OLD_REASONING])
def test_a_template_that_rewrites_earlier_turns_is_rendered_whole(smollm2, template):
    tok = with_template(smollm2, template)
    messages = history(tok, 41, seed=3)  # ends with a question
    assert messages[4]["role"] == "assistant"
    messages[4]["content"] = "<think>hm</think>" + messages[4]["content"]
    encoding = encode_segments(tok, messages)
    assert encoding == per_prefix_segments(tok, messages) and not encoding.exact
    assert encoding.token_ids == tok.encode(tok.apply_chat_template(messages))


def tool_conversation(rounds: int) -> list[dict]:
    """OpenAI-shaped: questions, answers that call tools (one or two calls), their results."""
    messages: list[dict] = [{"role": "system", "content": "Use the tools."}]
    for i in range(rounds):
        messages.append({"role": "user", "content": f"What is {i} * 7?"})
        calls = [
            {
                "id": f"c{i}-{k}",
                "type": "function",
                "function": {"name": "calc", "arguments": f'{{"x": {i + k}}}'},
            }
            for k in range(1 + i % 2)
        ]
        messages.append(
            {"role": "assistant", "content": None if i % 3 else "Let me see.", "tool_calls": calls}
        )
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{7 * i}"})
        messages.append({"role": "assistant", "content": f"It is {7 * i}."})
    messages.append({"role": "user", "content": "Thanks!"})
    return messages


TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(("fmt", "template"), [(HermesFormat(), None), (Llama3Format(), LLAMA31_LIKE)])
def test_tool_calls_and_results_get_the_per_prefix_ids(smollm2, fmt, template):
    tok = with_template(smollm2, template)
    plain = [
        {"role": m["role"], "content": m.get("content") or ""}
        for m in fmt.render(tool_conversation(60), TOOLS)
    ]
    assert len(plain) > 200 and any("calc" in m["content"] for m in plain[2:])
    # A call the model generated is stored as its ids, as the chat stores it.
    for message in plain[3::7]:
        if message["role"] == "assistant":
            message["token_ids"] = tok.encode(message["content"]) + tok.eos_token_ids[:1]
    assert encode_segments(tok, plain) == per_prefix_segments(tok, plain)


class CountingTokenizer(Tokenizer):
    """Counts the messages its chat template is asked to render."""

    rendered = 0

    def apply_chat_template(self, messages, add_generation_prompt=True):
        self.rendered += len(messages)
        return super().apply_chat_template(messages, add_generation_prompt)


@pytest.mark.parametrize("template", [None, TRIMMING])
def test_rendering_is_linear_in_the_messages_on_either_path(smollm2, template):
    tok = CountingTokenizer(with_template(smollm2, template).hf)
    counts = []
    for n in (400, 800):
        messages = history(tok, n, seed=1)
        tok.rendered = 0
        encode_segments(tok, messages)
        counts.append(tok.rendered)
    assert counts[1] <= 2.2 * counts[0] and counts[1] <= 12 * 801


def test_the_api_encodes_every_message_the_same_way_past_64(smollm2):
    from conversations.api.app import encode_chat as api_encode_chat

    tok = with_template(smollm2, SEPARATED)
    messages = [{"role": "system", "content": "Sys. "}]
    messages += [{"role": ("user", "assistant")[i % 2], "content": f"line {i} "} for i in range(300)]
    engine = SimpleNamespace(tokenizer=tok)
    prompt, shared = asyncio.run(api_encode_chat(engine, messages, shared=True))
    expected = per_prefix_segments(tok, messages)
    assert prompt == expected.token_ids and shared == len(expected.segments[0])
    # One render tokenised at once merges across the turns' plain-text seams: not what it sends.
    assert prompt != tok.encode(tok.apply_chat_template(messages))


@pytest.mark.parametrize(
    ("name", "marked"),
    [("smollm2", True), ("separated", True), ("trimming", False), ("mistral", False), ("json", False)],
)
def test_templates_that_change_contents_take_the_local_probes(smollm2, name, marked):
    from inference.prompt.layout import marked_layout, render
    from inference.prompt.local import local_layout

    tok = with_template(smollm2, TEMPLATES[name])
    messages = history(tok, 21, seed=2, system=name != "mistral")
    text, before = render(tok, messages), render(tok, messages[:-1])
    assert (marked_layout(tok, messages, text, before) is not None) == marked
    assert local_layout(tok, messages, text, before) is not None


def test_the_offline_llm_encodes_chats_with_the_same_encoder(smollm2, monkeypatch):
    from inference.engine.llm import LLM

    llm = LLM.__new__(LLM)  # no model: only the prompts it would generate from are looked at
    llm.engine = SimpleNamespace(tokenizer=smollm2)
    monkeypatch.setattr(LLM, "generate", lambda self, prompts, sampling_params=None: prompts)
    conversations = [history(smollm2, 100, seed=seed) for seed in (1, 2)]
    assert llm.chat(conversations) == [per_prefix_segments(smollm2, c).token_ids for c in conversations]
    assert llm.chat(conversations[0], add_generation_prompt=False) == [
        per_prefix_segments(smollm2, conversations[0], False).token_ids
    ]


@pytest.mark.parametrize("template", [*TEMPLATES.values(), LAST_ONLY, STRIPS_OLD_REASONING, TOOL_TEMPLATE])
def test_the_tokenizer_renders_what_transformers_renders(smollm2, template):
    tok = with_template(smollm2, template)
    messages = [{"role": m["role"], "content": m["content"]} for m in history(tok, 30, seed=4, system=False)]
    messages[-2]["content"] += "<tool_response>1</tool_response>"
    odd = [*messages[:-1], {"role": "user", "content": None}]  # transformers' own conversions
    for chat in (messages, messages[:1], odd):
        for generation_prompt in (True, False):
            expected = outcome(
                tok.hf.apply_chat_template, chat, tokenize=False, add_generation_prompt=generation_prompt
            )
            assert outcome(tok.apply_chat_template, chat, generation_prompt) == expected


def outcome(render, *args, **kwargs) -> tuple[str, object]:
    """A render's text, or the kind of error it raised (some templates fail on a None content)."""
    try:
        return "text", render(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return "error", type(exc)


def test_a_template_that_raises_raises_either_way(smollm2):
    from jinja2.exceptions import TemplateError

    tok = with_template(smollm2, MISTRAL_LIKE)
    with pytest.raises(TemplateError, match="alternate"):
        tok.apply_chat_template([{"role": "assistant", "content": "first"}])


class CountingRenders:
    """A tokenizer that counts the template renders it is asked for; ``day`` is a date the
    template prints in its header, changed by the test as a day passes."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.inner, self.renders, self.day = tokenizer, 0, "1 Dec"
        self.eos_token_ids = tokenizer.eos_token_ids

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def encode_batch(self, texts):
        return self.inner.encode_batch(texts)

    def token_text(self, token_id: int) -> str:
        return self.inner.token_text(token_id)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        self.renders += 1
        return f"Today: {self.day}\n" + self.inner.apply_chat_template(messages, add_generation_prompt)


def test_a_role_sequence_is_probed_once_and_again_when_the_template_output_changes(smollm2) -> None:
    counting = CountingRenders(smollm2)
    question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    first = encode_segments(counting, question)
    renders_first = counting.renders
    again = encode_segments(counting, [question[0], {"role": "user", "content": "Another question"}])
    assert counting.renders - renders_first < renders_first  # the marked probe and the tails were kept
    assert again.exact and first.exact

    counting.day = "2 Dec"  # the kept probe no longer matches the render: probed afresh
    renders_before = counting.renders
    after = encode_segments(counting, question)
    assert counting.renders - renders_before == renders_first  # probed again, as the first time
    assert after.exact
    unseen = CountingRenders(smollm2)  # a tokenizer with nothing kept
    unseen.day = "2 Dec"
    assert after == encode_segments(unseen, question)
    assert after.segments[1:] == first.segments[1:] and after.segments[0] != first.segments[0]
