"""How phases are tracked for the configured parsers, decided once at startup.

The rule: the phase of a token is what vLLM's own parser says it is. For each
side of the parser pair (reasoning, tool calls) phasespec uses, in order:

1. vLLM's declarative parser (``vllm.parser.engine``): its own state machine,
   run per response (engine.compat.ParserMachine). Exact for multi-token
   markers, spelling variants and BPE merges, because it is vLLM's lexer.
2. A classic parser's markers as token ids: ``ReasoningConfig``'s start/end
   ids (derived by vLLM from the reasoning parser), the tool parser's
   ``tool_call(s)_start_token``-style attributes, encoded once.
3. Nothing: the side is not tracked, and startup says so loudly (a tool call
   of an untracked parser is drafted and counted as answer).

``PhasePlan.describe()`` is logged at startup and shown in /phasespec/state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from engine.compat import ParserMachine, natural_reasoning_end_ids, parser_engine_config
from proxy.phases import ParserTracker, Phase, PhaseMarkers, PhaseTracker

log = logging.getLogger("phasespec.phases")

_TOOL_START_ATTRS = ("tool_calls_start_token", "tool_call_start_token", "bot_token")
_TOOL_END_ATTRS = ("tool_calls_end_token", "tool_call_end_token", "eot_token")


@dataclass(slots=True)
class PhasePlan:
    markers: PhaseMarkers
    """Token-id markers of the classic parsers (empty where a parser engine tracks)."""
    tokenizer: Any = None
    reasoning_config: Any = None
    """vLLM's ParserEngineConfig for the reasoning side, if it is a parser engine."""
    tool_config: Any = None
    end_text: str = ""
    """The reasoning end marker as text (where a delta is cut when reasoning ends in it)."""
    description: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    _vocab: dict[str, int] | None = None

    @property
    def engine_based(self) -> bool:
        return self.reasoning_config is not None or self.tool_config is not None

    def tracker(self, reasoning_ended: bool | None) -> PhaseTracker | ParserTracker:
        """A fresh tracker for one response; ``reasoning_ended`` is what vLLM told generate()."""
        if not self.engine_based:
            return PhaseTracker(self.markers, self.markers.initial_phase(reasoning_ended))
        if self._vocab is None:
            self._vocab = self.tokenizer.get_vocab()
        has_reasoning = self.reasoning_config is not None or bool(self.markers.reasoning_end)
        phase = Phase.REASONING if reasoning_ended is False and has_reasoning else Phase.ANSWER
        reasoning: ParserMachine | PhaseTracker | None = None
        if self.reasoning_config is not None:
            reasoning = ParserMachine(self.reasoning_config, self.tokenizer, self._vocab, reasoning=True, tools=False)
        elif self.markers.reasoning_end:
            reasoning = PhaseTracker(PhaseMarkers(reasoning_end=self.markers.reasoning_end), Phase.REASONING)
        content: ParserMachine | PhaseTracker | None = None
        if self.tool_config is not None:
            content = ParserMachine(
                self.tool_config, self.tokenizer, self._vocab, reasoning=False, tools=True, markup=has_reasoning
            )
        elif self.markers.tool_start:
            content = PhaseTracker(
                PhaseMarkers(tool_start=self.markers.tool_start, tool_end=self.markers.tool_end), Phase.ANSWER
            )
        return ParserTracker(phase, reasoning, content, end_ids=self.markers.reasoning_end, end_text=self.end_text)

    def describe(self) -> dict[str, Any]:
        return {**self.description, "warnings": list(self.warnings)}


def _literal(config: Any, terminal: str) -> str | None:
    return config.terminal_literal(terminal) if config is not None else None


def _spellings(config: Any, *terminals: str) -> list[str]:
    out: list[str] = []
    for name in terminals:
        value = config.terminals.get(name)
        out += [value] if isinstance(value, str) else list(value or ())
    return out


def plan_from_vllm(
    vllm_config: Any, tokenizer: Any, reasoning_parser: str | None, tool_parser: str | None
) -> PhasePlan:
    """The plan for this server's parsers (vLLM's own parser classes and ReasoningConfig)."""
    plan = PhasePlan(PhaseMarkers(), tokenizer)
    reasoning_side = _reasoning_side(plan, vllm_config, tokenizer, reasoning_parser)
    tool_side = _tool_side(plan, tokenizer, tool_parser)
    end = plan.markers.reasoning_end
    plan.end_text = _literal(plan.reasoning_config, "THINK_END") or (tokenizer.decode(list(end)) if end else "")
    plan.description = {"reasoning": reasoning_side, "tool_call": tool_side}
    for warning in plan.warnings:
        log.warning(warning)
    log.info("phase tracking: %s", plan.description)
    return plan


def _reasoning_side(plan: PhasePlan, vllm_config: Any, tokenizer: Any, name: str | None) -> dict[str, Any]:
    if not name:
        return {"parser": None, "tracked_by": None}
    from vllm.reasoning import ReasoningParserManager

    config = parser_engine_config(ReasoningParserManager.get_reasoning_parser(name), tokenizer)
    reasoning = getattr(vllm_config, "reasoning_config", None)
    end: tuple[int, ...] = ()
    start: tuple[int, ...] = ()
    if reasoning is not None and getattr(reasoning, "enabled", False):
        start = tuple(reasoning.reasoning_start_token_ids or ())
        end = natural_reasoning_end_ids(reasoning, tokenizer)
    if config is not None:
        plan.reasoning_config = config
        end_ids = _single_id(tokenizer, _literal(config, "THINK_END"))
        plan.markers = PhaseMarkers(reasoning_end=end_ids, tool_start=plan.markers.tool_start)
        markers = _spellings(config, "THINK_START", "THINK_END")
        return {"parser": name, "tracked_by": "vllm parser engine", "markers": markers}
    plan.markers = PhaseMarkers(start, end, plan.markers.tool_start, plan.markers.tool_end)
    if not end:
        plan.warnings.append(
            f"phasespec cannot track reasoning of reasoning parser {name!r}: no end-of-reasoning marker "
            "(vLLM's ReasoningConfig has none); every token is tracked as answer"
        )
        return {"parser": name, "tracked_by": None}
    texts = [tokenizer.decode(list(ids)) for ids in (start, end) if ids]
    return {"parser": name, "tracked_by": "token ids", "markers": texts, "ids": [list(start), list(end)]}


def _tool_side(plan: PhasePlan, tokenizer: Any, name: str | None) -> dict[str, Any]:
    if not name:
        return {"parser": None, "tracked_by": None}
    from vllm.tool_parsers import ToolParserManager

    parser_cls = ToolParserManager.get_tool_parser(name)
    config = parser_engine_config(parser_cls, tokenizer)
    if config is not None:
        plan.tool_config = config
        return {
            "parser": name,
            "tracked_by": "vllm parser engine",
            "markers": _spellings(config, "TOOL_START", "TOOL_END"),
        }
    parser = parser_cls(tokenizer)
    start = _encode_first(tokenizer, parser, _TOOL_START_ATTRS)
    end = _encode_first(tokenizer, parser, _TOOL_END_ATTRS) if start else ()
    m = plan.markers
    plan.markers = PhaseMarkers(m.reasoning_start, m.reasoning_end, start, end)
    if not start:
        plan.warnings.append(
            f"phasespec cannot track tool calls of tool parser {name!r}: it names no start marker "
            f"({', '.join(_TOOL_START_ATTRS)}) and is not a vLLM parser engine; its tool calls are "
            "tracked, and drafted, as answer"
        )
        return {"parser": name, "tracked_by": None}
    texts = [tokenizer.decode(list(ids)) for ids in (start, end) if ids]
    return {"parser": name, "tracked_by": "token ids", "markers": texts, "ids": [list(start), list(end)]}


def _single_id(tokenizer: Any, text: str | None) -> tuple[int, ...]:
    ids = tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()
    return ids if len(ids) == 1 else ()


def _encode_first(tokenizer: Any, parser: object, attrs: tuple[str, ...]) -> tuple[int, ...]:
    for attr in attrs:
        text = getattr(parser, attr, None)
        if isinstance(text, str) and text:
            return tuple(tokenizer.encode(text, add_special_tokens=False))
    return ()
