"""Which phase each generated token belongs to: reasoning, answer or tool call.

Tracked on token ids, with the markers vLLM itself derives from the
configured parsers (``ReasoningConfig``'s start/end token ids, the tool
parser's start/end tokens), so the phase never disagrees with the reasoning
text the response returns. A delta may carry several tokens (a speculative
step emits up to K+1, outputs merge under load); the tracker walks them one by
one, so a marker in the middle of a delta splits it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from engine.compat import natural_reasoning_end_ids


class Phase(StrEnum):
    REASONING = "reasoning"
    ANSWER = "answer"
    TOOL_CALL = "tool_call"


@dataclass(frozen=True, slots=True)
class PhaseMarkers:
    """Token-id sequences that move a response between phases (empty: none)."""

    reasoning_start: tuple[int, ...] = ()
    reasoning_end: tuple[int, ...] = ()
    tool_start: tuple[int, ...] = ()
    tool_end: tuple[int, ...] = ()

    @property
    def longest(self) -> int:
        return max(map(len, (self.reasoning_start, self.reasoning_end, self.tool_start, self.tool_end)))

    def initial_phase(self, reasoning_ended: bool | None) -> Phase:
        """vLLM tells generate() whether the prompt already closed reasoning;
        ``False`` means the prompt opened it (or the parser counts output as
        reasoning until the end marker, as deepseek_r1 does)."""
        if reasoning_ended is False and self.reasoning_end:
            return Phase.REASONING
        return Phase.ANSWER


@dataclass(frozen=True, slots=True)
class Transition:
    index: int
    """Position in the response's token ids of the first token of the new phase."""
    phase: Phase


def _ends_with(tokens: list[int], marker: tuple[int, ...]) -> bool:
    return bool(marker) and len(tokens) >= len(marker) and tuple(tokens[-len(marker) :]) == marker


@dataclass(slots=True)
class PhaseTracker:
    markers: PhaseMarkers
    phase: Phase
    tokens: dict[Phase, int] = field(default_factory=lambda: dict.fromkeys(Phase, 0))
    seen: int = 0
    _tail: list[int] = field(default_factory=list)

    def feed(self, token_ids: list[int] | tuple[int, ...]) -> list[Transition]:
        """Account for newly generated tokens; return the phase changes they cause.

        A marker token belongs to the phase it closes or opens as the parsers
        treat it: ``</think>`` and ``</tool_call>`` to the phase they end,
        ``<think>`` and ``<tool_call>`` to the phase they begin.
        """
        changes: list[Transition] = []
        keep = max(self.markers.longest - 1, 0)
        for token in token_ids:
            self._tail.append(token)
            opened = self._opened_phase()
            if opened is not None:
                self.phase = opened
                changes.append(Transition(self.seen, opened))
            self.tokens[self.phase] += 1
            self.seen += 1
            closed = self._closed_phase()
            if closed is not None:
                self.phase = closed
                changes.append(Transition(self.seen, closed))
            if len(self._tail) > keep:
                del self._tail[: len(self._tail) - keep]
        return changes

    def _opened_phase(self) -> Phase | None:
        return self._transition(_OPENERS)

    def _closed_phase(self) -> Phase | None:
        return self._transition(_CLOSERS)

    def _transition(self, table: tuple[tuple[Phase, str, Phase], ...]) -> Phase | None:
        for source, marker, target in table:
            if self.phase is source and _ends_with(self._tail, getattr(self.markers, marker)):
                return target
        return None


# (phase we are in, marker that just completed, phase it leads to)
_OPENERS = (
    (Phase.ANSWER, "reasoning_start", Phase.REASONING),
    (Phase.ANSWER, "tool_start", Phase.TOOL_CALL),
)
_CLOSERS = (
    (Phase.REASONING, "reasoning_end", Phase.ANSWER),
    (Phase.TOOL_CALL, "tool_end", Phase.ANSWER),
)


_TOOL_START_ATTRS = ("tool_calls_start_token", "tool_call_start_token", "bot_token")
_TOOL_END_ATTRS = ("tool_calls_end_token", "tool_call_end_token", "eot_token")


def markers_from_vllm(vllm_config: object, tokenizer: object, tool_parser: str | None) -> PhaseMarkers:
    """The markers vLLM's own parser configuration defines for this model.

    Reasoning: ``ReasoningConfig``'s token ids, which vLLM derives from the
    configured reasoning parser. Tool calls: the configured tool parser's start
    and end tokens (the attribute names vLLM's parsers use); a parser without
    such markers gives no tool_call phase.
    """
    reasoning = getattr(vllm_config, "reasoning_config", None)
    start: tuple[int, ...] = ()
    end: tuple[int, ...] = ()
    if reasoning is not None and reasoning.enabled:
        start = tuple(reasoning.reasoning_start_token_ids or ())
        end = natural_reasoning_end_ids(reasoning, tokenizer)
    tool_start: tuple[int, ...] = ()
    tool_end: tuple[int, ...] = ()
    if tool_parser:
        from vllm.tool_parsers import ToolParserManager

        parser = ToolParserManager.get_tool_parser(tool_parser)(tokenizer)  # type: ignore[arg-type]
        tool_start = _encode_first(tokenizer, parser, _TOOL_START_ATTRS)
        tool_end = _encode_first(tokenizer, parser, _TOOL_END_ATTRS) if tool_start else ()
    return PhaseMarkers(start, end, tool_start, tool_end)


def _encode_first(tokenizer: object, parser: object, attrs: tuple[str, ...]) -> tuple[int, ...]:
    for attr in attrs:
        text = getattr(parser, attr, None)
        if isinstance(text, str) and text:
            return tuple(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
    return ()
