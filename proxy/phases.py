"""Which phase each generated token belongs to: reasoning, answer or tool call.

The phase is what vLLM's own parser says (proxy/phase_plan.py picks how, per
parser pair). Two trackers, one interface (``feed``, ``phase``, ``tokens``):

- ``PhaseTracker``, for classic parsers whose markers are single tokens or
  fixed token sequences (``ReasoningConfig``'s ids, the tool parser's start and
  end tokens): walks the token ids one by one, so a marker in the middle of a
  delta splits it exactly. A delta may carry several tokens (a speculative step
  emits up to K+1, outputs merge under load).
- ``ParserTracker``, for vLLM's declarative parsers (``vllm.parser.engine``:
  deepseek_v4, qwen3, qwen3_coder, ...): runs vLLM's own state machine on the
  streamed text and token ids, composed the way vLLM's ``DelegatingParser``
  composes a reasoning and a tool parser, and reads its state. Multi-token
  markers, their spelling variants and context-dependent tokenizations are
  then whatever vLLM's lexer makes of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from engine import spec_stats


class Phase(StrEnum):
    REASONING = spec_stats.REASONING
    ANSWER = spec_stats.ANSWER
    TOOL_CALL = spec_stats.TOOL_CALL


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
    _markup: int = 0

    @property
    def reasoning_tokens(self) -> int:
        """Tokens of reasoning text, the end marker excluded (vLLM's definition)."""
        return self.tokens[Phase.REASONING] - self._markup

    def feed(self, token_ids: list[int] | tuple[int, ...], text: str = "") -> list[Transition]:
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
            if closed is not None and self.phase is Phase.REASONING:
                self._markup += len(self.markers.reasoning_end)
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


class Machine(Protocol):
    """One of vLLM's parser state machines for one response (engine.compat.ParserMachine)."""

    def feed(self, text: str, token_ids: list[int]) -> None: ...

    @property
    def state(self) -> str: ...

    @property
    def reasoning_tokens(self) -> int: ...


@dataclass(slots=True)
class ParserTracker:
    """Phases from vLLM's parser state machines, composed as ``DelegatingParser`` does.

    While reasoning, the reasoning stage sees the stream: vLLM's machine run
    with tool parsing off (as its reasoning adapter runs it), or, for a classic
    reasoning parser, its end-marker ids. Once it leaves reasoning, the rest of
    that delta and everything after goes to the content stage: vLLM's tool
    parser machine started on content, or a classic tool parser's token markers.

    Token counts: reasoning is cut exactly at a single-token end marker (the
    marker itself is not reasoning text, as vLLM counts); after reasoning,
    counts are per delta (a delta that opens a tool block counts to the phase
    it ends in).
    """

    phase: Phase
    reasoning: Machine | PhaseTracker | None
    content: Machine | PhaseTracker | None
    end_ids: tuple[int, ...] = ()
    """The reasoning end marker's ids and text: where a delta is cut when reasoning ends in it."""
    end_text: str = ""
    in_content: bool = False
    _first_block: int = 0
    tokens: dict[Phase, int] = field(default_factory=lambda: dict.fromkeys(Phase, 0))
    seen: int = 0

    @property
    def reasoning_tokens(self) -> int:
        """Tokens of reasoning text (end markers excluded, as vLLM counts): those
        of the first reasoning block, cut exactly at its end marker, plus what
        vLLM's content-stage machine counted (interleaved thinking)."""
        machine = self.content is not None and not isinstance(self.content, PhaseTracker)
        again = self.content.reasoning_tokens if machine else 0  # type: ignore[union-attr]
        return self._first_block + again

    def feed(self, token_ids: Sequence[int], text: str = "") -> list[Transition]:
        ids = list(token_ids)
        changes: list[Transition] = []
        if not self.in_content and self.phase is Phase.REASONING and self.reasoning is not None:
            ids, text = self._feed_reasoning(ids, text, changes)
        if ids and (self.in_content or self.phase is not Phase.REASONING):
            # Once reasoning has ended, everything goes to the content stage (as in
            # DelegatingParser), whose machine may itself enter reasoning again
            # (interleaved thinking).
            self.in_content = True
            self._feed_content(ids, text, changes)
        return changes

    def _feed_reasoning(self, ids: list[int], text: str, changes: list[Transition]) -> tuple[list[int], str]:
        stage = self.reasoning
        if isinstance(stage, PhaseTracker):
            for i, token in enumerate(ids):
                stage.feed([token])
                if stage.phase is not Phase.REASONING:
                    self._count(Phase.REASONING, i + 1)
                    self._first_block = stage.reasoning_tokens
                    self._enter(Phase.ANSWER, changes)
                    after = text.split(self.end_text, 1)[1] if self.end_text and self.end_text in text else text
                    return ids[i + 1 :], after
            self._count(Phase.REASONING, len(ids))
            self._first_block = stage.reasoning_tokens
            return [], ""
        assert stage is not None
        head, rest = _split_at_end(ids, text, self.end_ids, self.end_text)
        stage.feed(head[1], head[0])
        if stage.state == Phase.REASONING:
            if rest[0]:
                stage.feed(rest[1], rest[0])  # an end marker the machine did not take as one
            self._count(Phase.REASONING, len(ids))
            self._first_block = self.tokens[Phase.REASONING]
            return [], ""
        # Reasoning ended at the marker: the content stage gets what follows it,
        # as DelegatingParser hands the rest of the delta to the tool parser.
        self._count(Phase.REASONING, len(head[0]))
        self._first_block = self.tokens[Phase.REASONING] - (
            len(self.end_ids) if head[0][-1:] == list(self.end_ids) else 0
        )
        self._enter(Phase.ANSWER, changes)
        return rest

    def _feed_content(self, ids: list[int], text: str, changes: list[Transition]) -> None:
        stage = self.content
        if stage is None:
            self._count(self.phase, len(ids))
            return
        if isinstance(stage, PhaseTracker):
            offset = self.seen - stage.seen
            before = dict(stage.tokens)
            changes += [Transition(offset + c.index, c.phase) for c in stage.feed(ids)]
            for phase in Phase:
                self._count(phase, stage.tokens[phase] - before[phase])
            self.phase = stage.phase
            return
        stage.feed(text, ids)
        self._enter(Phase(stage.state), changes)
        self._count(self.phase, len(ids))

    def _enter(self, phase: Phase, changes: list[Transition]) -> None:
        if phase is not self.phase:
            self.phase = phase
            changes.append(Transition(self.seen, phase))

    def _count(self, phase: Phase, n: int) -> None:
        self.tokens[phase] += n
        self.seen += n


def _split_at_end(
    ids: list[int], text: str, end_ids: tuple[int, ...], end_text: str
) -> tuple[tuple[list[int], str], tuple[list[int], str]]:
    """A delta cut after its first reasoning end marker: (ids, text) up to and
    including it, and after it. Uncut when the marker is not one known token."""
    if len(end_ids) == 1 and end_ids[0] in ids and end_text and end_text in text:
        i = ids.index(end_ids[0]) + 1
        before, after = text.split(end_text, 1)
        return (ids[:i], before + end_text), (ids[i:], after)
    return (ids, text), ([], "")


@dataclass(slots=True)
class ForcedToolCall:
    """A response under ``tool_choice`` required or named: vLLM constrains everything after
    reasoning to the tool call's JSON, with no markup for a tool parser to see, so what the
    parsers call answer is the tool call. Relabels the inner tracker's answer as tool_call."""

    inner: PhaseTracker | ParserTracker

    @property
    def phase(self) -> Phase:
        return _forced(self.inner.phase)

    @property
    def tokens(self) -> dict[Phase, int]:
        counts = self.inner.tokens
        return {
            Phase.REASONING: counts[Phase.REASONING],
            Phase.ANSWER: 0,
            Phase.TOOL_CALL: counts[Phase.ANSWER] + counts[Phase.TOOL_CALL],
        }

    @property
    def seen(self) -> int:
        return self.inner.seen

    @property
    def reasoning_tokens(self) -> int:
        return self.inner.reasoning_tokens

    def feed(self, token_ids: Sequence[int], text: str = "") -> list[Transition]:
        return [Transition(change.index, _forced(change.phase)) for change in self.inner.feed(list(token_ids), text)]


def _forced(phase: Phase) -> Phase:
    return Phase.TOOL_CALL if phase is Phase.ANSWER else phase
