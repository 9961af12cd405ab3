"""Chat templates written for the tests, one per model family, each writing its family's
documented markers for reasoning and tool calls (real checkpoints' tokenizer files cannot be
downloaded here). They render plain role/content messages as the family's template does
(gpt-oss's, in ``templates/``, also its tools, calls, results and reasoning);
the tool-call and reasoning formats are picked from these markers alone.

``FAMILY_TEMPLATES``: family -> (template, tool format name, reasoning format).
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES_DIR = Path(__file__).parent / "templates"

_CHATML = "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"

# Qwen3: ChatML, <think> reasoning (earlier turns' thinking stripped), Hermes <tool_call>.
QWEN3 = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{%- if m['role'] == 'assistant' and '</think>' in m['content'] %}"
    "{{ m['content'].split('</think>')[-1].lstrip('\\n') }}"
    "{%- else %}{{ m['content'] }}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{#- tools: <tools></tools>, calls: <tool_call>\\n{...}\\n</tool_call>, results: <tool_response> #}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{%- endif %}"
    "{%- endif %}"
)

# SmolLM3: ChatML with /think and /no_think; think mode writes <think>...</think>.
SMOLLM3 = (
    _CHATML + "{#- reasoning_mode /think: <think> ... </think>; tool calls in <tool_call> #}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if messages and messages[0]['content'].endswith('/no_think') %}<think>\n\n</think>\n{%- endif %}"
    "{%- endif %}"
)

# Llama 3.1: header ids, ipython turns for results, <|python_tag|> / JSON calls.
LLAMA31 = (
    "{{- bos_token }}{%- for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>"
    "{%- endfor %}"
    '{#- calls: <|python_tag|> or {"name": ..., "parameters": ...}; results in ipython #}'
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)

# Mistral (v3 tokenizer): [INST], [AVAILABLE_TOOLS], [TOOL_CALLS][...], [TOOL_RESULTS].
MISTRAL_V3 = (
    "{{- bos_token }}{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + m['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif m['role'] == 'user' %}{{ '[INST]' + m['content'] + '[/INST]' }}"
    "{%- elif m['role'] == 'assistant' %}{{ m['content'] + eos_token }}"
    "{%- else %}{{ raise_exception('Only user and assistant roles are supported!') }}{%- endif %}"
    "{%- endfor %}{#- [TOOL_CALLS] [TOOL_RESULTS] #}"
)

# Mistral Small 3.2 / Magistral (v11+): [TOOL_CALLS]name[ARGS]{...}.
MISTRAL_V11 = MISTRAL_V3.replace("{#- [TOOL_CALLS] [TOOL_RESULTS] #}", "{#- [TOOL_CALLS]name[ARGS]{} #}")

# Granite 3.x: roles in <|start_of_role|>, calls after <|tool_call|>.
GRANITE3 = (
    "{%- for m in messages %}<|start_of_role|>{{ m['role'] }}<|end_of_role|>{{ m['content'] }}"
    "<|end_of_text|>\n{%- endfor %}{#- calls: <|tool_call|>[...] #}"
    "{%- if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{%- endif %}"
)

# gpt-oss: harmony messages with channels (analysis, commentary, final), tools, calls and
# results as the family's template writes them.
GPT_OSS = (TEMPLATES_DIR / "gpt_oss.jinja").read_text()

FAMILY_TEMPLATES: dict[str, tuple[str, str, str | None]] = {
    "qwen3": (QWEN3, "hermes", "think"),
    "smollm3": (SMOLLM3, "hermes", "think"),
    "llama3.1": (LLAMA31, "llama3", None),
    "mistral": (MISTRAL_V3, "mistral", None),
    "mistral-v11": (MISTRAL_V11, "mistral_args", None),
    "granite3": (GRANITE3, "granite", None),
    "gpt-oss": (GPT_OSS, "harmony", "harmony"),
}

HARMONY_SPECIAL_TOKENS = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
]
