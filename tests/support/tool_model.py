"""A scripted model that calls a tool, then answers from its result: for tests of the chat's
tool loop (a random-weight model never writes a call on its own).

``ToolScriptModel`` answers after a *marker* token with that marker's script, token by token,
then EOS. Unlike ``tests.support.fakes.ScriptedModel`` (whose next token depends on the
current one alone, so a script cannot repeat a token, which JSON always does), it keeps a
state per token in its KV pool: how far into which script the sequence is. The tokenizer is
SmolLM2's with a ChatML template whose generation prompt ends in another token after a tool
result (``\\n\\n`` instead of ``\\n``), so a question gets ``TOOL_CALL_TEXT`` (a call in the
generic format) and a tool result gets ``TOOL_ANSWER``.

``scripted_tool_model`` is an ``ENGINE_LOADER``; ``failing_tool_model`` calls the calculator
with a division by zero.
"""

from __future__ import annotations

import dataclasses

import torch

from inference.models.registry import read_model_config

CALL_ARGUMENTS = '{"expression": "6*7"}'
TOOL_CALL_TEXT = '<tool_call>{"name": "calculator", "arguments": ' + CALL_ARGUMENTS + "}</tool_call>"
FAILING_CALL_TEXT = '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
TOOL_ANSWER = "Done: the tool said so."

TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if messages and '</tool_response>' in messages[-1]['content'] %}{{ '\\n' }}{% endif %}{% endif %}"
)

_STEP = 100_000  # state = script index * _STEP + position in it; -1: no script


class ToolScriptModel(torch.nn.Module):
    supports_cuda_graphs = False

    def __init__(self, config, scripts: dict[int, list[int]], eos_token_id: int) -> None:
        super().__init__()
        self.config = config
        self.markers = list(scripts)
        self.scripts = [scripts[m] for m in self.markers]
        self.eos = eos_token_id
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    @classmethod
    def kv_spec_for(cls, config):
        from inference.kv.spec import KVSpec

        return KVSpec(num_layers=1, planes=1, token_shape=(1,))

    @property
    def kv_spec(self):
        return self.kv_spec_for(self.config)

    @classmethod
    def recurrent_spec_for(cls, config):
        return None

    def prepare_cpu_kernels(self) -> None:
        """No weights to pack: the model contract's CPU hook does nothing here."""

    def load_weights(self, state_dict, device=None, dtype=None) -> None:
        """Built whole in the test, never from a checkpoint."""
        raise NotImplementedError("a scripted stand-in has no checkpoint")

    def _next_state(self, token: int, previous: float) -> float:
        if token in self.markers:
            return float(self.markers.index(token) * _STEP)
        return previous + 1 if previous >= 0 else -1.0

    def forward(self, input_ids, positions, ctx, kv_cache):
        block_size = kv_cache.shape[3]
        cells = kv_cache.view(-1)  # one number per slot: [block, plane, layer, offset, 1]
        states = torch.full((input_ids.shape[0], 1), -1.0)
        starts = ctx.query_start_loc.tolist()
        for seq, (first, last) in enumerate(zip(starts, starts[1:], strict=False)):
            previous = -1.0
            for row in range(first, last):
                position = int(positions[row])
                if row == first and position > 0:  # the state of the token before, from the pool
                    block = int(ctx.block_tables[seq][(position - 1) // block_size])
                    previous = float(cells[block * block_size + (position - 1) % block_size])
                previous = self._next_state(int(input_ids[row]), previous)
                states[row, 0] = previous
                slot = int(ctx.slot_mapping[row])
                if slot >= 0:
                    cells[(slot // block_size) * block_size + slot % block_size] = previous
        return states.to(self.anchor.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(hidden.shape[0], self.config.vocab_size)
        for row, state in enumerate(hidden[:, 0].tolist()):
            token = self.eos
            if state >= 0:
                script, step = self.scripts[int(state) // _STEP], int(state) % _STEP
                token = script[step] if step < len(script) else self.eos
            logits[row, token] = 100.0  # any ordinary temperature picks it too
        return logits


def _tool_model(call_text: str, answer: str, name: str):
    from transformers import AutoTokenizer

    from inference.tokenizer import Tokenizer
    from tests.support.fakes import smollm2_tokenizer_dir, tiny_hf_config

    hf = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    hf.chat_template = TOOL_TEMPLATE
    tokenizer = Tokenizer(hf)
    ask = tokenizer.encode_chat([{"role": "user", "content": "?"}])[-1]
    after_tool = tokenizer.encode_chat([{"role": "user", "content": "<tool_response>1</tool_response>"}])[-1]
    scripts = {ask: tokenizer.encode(call_text), after_tool: tokenizer.encode(answer)}
    if ask == after_tool or any(m in s for s in scripts.values() for m in scripts):
        raise ValueError("the markers must differ and appear in no script")
    config = dataclasses.replace(read_model_config(tiny_hf_config("llama")), name=name)
    return ToolScriptModel(config, scripts, tokenizer.eos_token_ids[0]), tokenizer, config


def scripted_tool_model():
    """``load_model``'s triple: a question gets ``TOOL_CALL_TEXT``, a tool result ``TOOL_ANSWER``."""
    return _tool_model(TOOL_CALL_TEXT, TOOL_ANSWER, "scripted-tool-caller")


def three_calls_tool_model():
    """As :func:`scripted_tool_model`, but a question gets three different calls in one
    answer (a call repeating an earlier one would end the list)."""
    others = "".join(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "' + e + '"}}</tool_call>'
        for e in ("2+2", "3*3")
    )
    return _tool_model(TOOL_CALL_TEXT + others, TOOL_ANSWER, "scripted-three-calls")


def failing_tool_model():
    """As :func:`scripted_tool_model`, but the call divides by zero."""
    return _tool_model(FAILING_CALL_TEXT, TOOL_ANSWER, "scripted-failing-caller")
