"""The grammar of allowed calls, per format: at most ``max_calls`` calls, complete after the
list (only the end token is left), free text first under ``auto``."""

from __future__ import annotations

import json

import pytest

from conversations.api.tool_grammar import tool_call_grammar
from inference.tools.formats import FORMATS, format_named

FUNCTIONS = [
    {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {"name": "now", "parameters": {"type": "object", "properties": {}}},
]
CALL = {"function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}
OTHER = {"function": {"name": "now", "arguments": "{}"}}


@pytest.fixture(scope="module")
def compiler():
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from tests.support.fakes import smollm2_tokenizer_dir

    hf = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    return xgr, xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf)), hf.eos_token_id


def _accepts(compiler, spec, text: str) -> tuple[bool, bool]:
    """(whether the grammar takes ``text``, whether only the end is left after it)."""
    xgr, compile_, eos = compiler
    matcher = xgr.GrammarMatcher(compile_.compile_structural_tag(spec.source))
    if not matcher.accept_string(text):
        return False, False
    return True, matcher.accept_token(eos) and matcher.is_terminated()


@pytest.mark.parametrize("name", FORMATS)
def test_calls_up_to_the_cap_then_the_end(compiler, name: str) -> None:
    fmt = format_named(name)
    cap = fmt.max_calls or 3
    calls = [CALL, OTHER, CALL][:cap]
    for choice, prefix in (("required", ""), ("auto", "Let me see. ")):
        spec = tool_call_grammar(fmt, FUNCTIONS, choice, 3)
        assert _accepts(compiler, spec, prefix + fmt.calls_text(calls)) == (True, True)
        assert _accepts(compiler, spec, prefix + fmt.calls_text(calls[:1])) == (True, True)
        if fmt.max_calls is None:  # one more than the cap is refused
            assert _accepts(compiler, spec, prefix + fmt.calls_text([*calls, OTHER]))[0] is False
    # A single call (parallel_tool_calls false, a named function) stops after one.
    one = tool_call_grammar(fmt, FUNCTIONS, "required", 1)
    assert _accepts(compiler, one, fmt.calls_text([CALL])) == (True, True)
    if fmt.max_calls is None:
        assert _accepts(compiler, one, fmt.calls_text([CALL, OTHER]))[0] is False


@pytest.mark.parametrize("name", ["hermes", "mistral", "granite"])
def test_auto_allows_plain_text_and_required_does_not(compiler, name: str) -> None:
    fmt = format_named(name)
    assert _accepts(compiler, tool_call_grammar(fmt, FUNCTIONS, "auto", 3), "Just text.") == (True, True)
    assert _accepts(compiler, tool_call_grammar(fmt, FUNCTIONS, "required", 3), "Just text.")[0] is False
    bad = fmt.list_open + fmt.call_begin("nope") + "{}" + fmt.call_end + fmt.list_close
    assert _accepts(compiler, tool_call_grammar(fmt, FUNCTIONS, "required", 3), bad)[0] is False


@pytest.mark.parametrize("family", ["mistral", "mistral-v11", "granite3", "gpt-oss", "llama3.1"])
def test_marker_tokens_match_the_grammar(family: str) -> None:
    """Where the family's markers are special tokens, the model's token ids of a call still
    match the grammar written as text."""
    import xgrammar as xgr

    from inference.tools import tool_format_for
    from tests.support.family_models import family_tokenizer

    tokenizer = family_tokenizer(family)
    fmt = tool_format_for(tokenizer)
    compiler = xgr.GrammarCompiler(
        xgr.TokenizerInfo.from_huggingface(tokenizer.hf, vocab_size=len(tokenizer.hf))
    )
    calls = [CALL, OTHER][: fmt.max_calls or 2]
    for choice, prefix in (("required", ""), ("auto", "Hi. ")):
        matcher = xgr.GrammarMatcher(
            compiler.compile_structural_tag(tool_call_grammar(fmt, FUNCTIONS, choice, 3).source)
        )
        ids = tokenizer.encode(prefix + fmt.calls_text(calls))
        assert any(i in tokenizer.marker_texts for i in ids) or family == "llama3.1"
        assert all(matcher.accept_token(i) for i in ids)
