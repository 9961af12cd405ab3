"""Scripted models with each family's chat template and marker tokens, for end-to-end tests
of the family's reasoning and tool-call formats through the engine (``FAMILY_TEMPLATES``).

The tokenizer is SmolLM2's with the family's markers added as tokens the way the family's
own tokenizer has them (special, so a plain decode drops them, except Qwen's ``<think>`` and
``<tool_call>``, which are ordinary added tokens). The model (``ToolScriptModel``) answers a
chat prompt with the family's scripted answer, token by token, then its end token.
"""

from __future__ import annotations

import dataclasses

from inference.models.registry import read_model_config
from tests.support.chat_templates import FAMILY_TEMPLATES, HARMONY_SPECIAL_TOKENS

_QWEN_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
SPECIAL_TOKENS: dict[str, list[str]] = {
    "qwen3": [],
    "smollm3": [],
    "llama3.1": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
    "mistral": [
        "[INST]",
        "[/INST]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[TOOL_CALLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
    ],
    "granite3": ["<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"],
    "gpt-oss": HARMONY_SPECIAL_TOKENS,
}
SPECIAL_TOKENS["mistral-v11"] = [*SPECIAL_TOKENS["mistral"], "[ARGS]"]

ARGUMENTS = '{"city": "Oslo"}'
REASONING = "The user wants the weather."
# What each family's model writes for "call get_weather for Oslo" (reasoning first where it has it).
ANSWERS: dict[str, str] = {
    "qwen3": f'<think>{REASONING}</think><tool_call>{{"name": "get_weather", "arguments": {ARGUMENTS}}}</tool_call>',
    "smollm3": f'<think>{REASONING}</think><tool_call>{{"name": "get_weather", "arguments": {ARGUMENTS}}}</tool_call>',
    "llama3.1": f'<|python_tag|>{{"name": "get_weather", "parameters": {ARGUMENTS}}}',
    "mistral": f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {ARGUMENTS}}}]',
    "mistral-v11": f"[TOOL_CALLS]get_weather[ARGS]{ARGUMENTS}",
    "granite3": f'<|tool_call|>[{{"name": "get_weather", "arguments": {ARGUMENTS}}}]',
    "gpt-oss": (
        f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant<|channel|>commentary "
        f"to=functions.get_weather <|constrain|>json<|message|>{ARGUMENTS}<|call|>"
    ),
}
HAS_REASONING = {"qwen3", "smollm3", "gpt-oss"}


def family_tokenizer(family: str):
    from transformers import AutoTokenizer

    from inference.tokenizer import Tokenizer
    from tests.support.fakes import smollm2_tokenizer_dir

    hf = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    if family in ("qwen3", "smollm3"):
        hf.add_tokens(_QWEN_ADDED)
    if SPECIAL_TOKENS[family]:
        hf.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[family]})
    hf.chat_template = FAMILY_TEMPLATES[family][0]
    return Tokenizer(hf)


def _script_ids(tokenizer, text: str, marker: int) -> list[int]:
    """The answer's ids, avoiding the prompt's last token (it restarts the script): a word equal
    to it is written in two pieces."""
    ids = tokenizer.encode(text)
    if marker not in ids:
        return ids
    word = tokenizer.decode([marker], skip_special_tokens=False)
    out: list[int] = []
    for part in text.split(word):
        if out or part != text.split(word)[0]:
            out += tokenizer.encode(word[: len(word) // 2]) + tokenizer.encode(word[len(word) // 2 :])
        out += tokenizer.encode(part) if part else []
    if marker in out:
        raise ValueError(f"cannot script {text!r} around the marker {word!r}")
    return out


def scripted_family_model(family: str, answer: str | None = None):
    """``load_model``'s triple: every chat prompt gets the family's scripted answer."""
    from tests.support.fakes import tiny_hf_config
    from tests.support.tool_model import ToolScriptModel

    tokenizer = family_tokenizer(family)
    ask = tokenizer.encode_chat([{"role": "user", "content": "?"}])[-1]
    script = _script_ids(tokenizer, ANSWERS[family] if answer is None else answer, ask)
    config = dataclasses.replace(read_model_config(tiny_hf_config("llama")), name=f"scripted-{family}")
    config = dataclasses.replace(config, vocab_size=max(config.vocab_size, len(tokenizer.hf)))
    return ToolScriptModel(config, {ask: script}, tokenizer.eos_token_ids[0]), tokenizer, config
