"""The engine core's per-request state (``RequestLedger``) and its counters, split by phase tag.

No vLLM imports: the engine hook feeds the counters exactly the numbers vLLM
feeds its own Prometheus counters, so per-request sums equal
``vllm:spec_decode_num_draft_tokens`` / ``_num_accepted_tokens``.

Definitions follow vLLM: a *verify step* is a step that verified at least one
draft token (vLLM's ``num_drafts``); *accepted* excludes the bonus token;
acceptance rate = accepted / drafted; mean acceptance length = 1 +
accepted / steps (it includes the bonus token).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.acceptance import RequestRates, ShadowBook

EXTRA_KEY = "phasespec"
"""phasespec's key in ``SamplingParams.extra_args`` (a request's depth metadata) and in
``additional_config`` (the engine-side options)."""
REASONING, ANSWER, TOOL_CALL = "reasoning", "answer", "tool_call"
PHASES = (REASONING, ANSWER, TOOL_CALL)
"""The phase tags: the front end tracks them (proxy/phases.py), the hook counts by them."""
DEFAULT_PHASE = "default"
"""The tag of a request no phase tracker follows."""
DECISION_LOG_CAP = 64


class DepthError(ValueError):
    """A speculative depth outside 0..K."""


def validate_depth(depth: int, max_depth: int) -> int:
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= max_depth:
        raise DepthError(f"speculative depth must be an integer in 0..{max_depth}, got {depth!r}")
    return depth


@dataclass(slots=True)
class PhaseCounters:
    """Counters of one request in one phase, under vLLM's names (``SpecDecodingStats``,
    ``vllm:spec_decode_*``): a draft is one verify step of one request."""

    max_depth: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    steps_by_drafted: list[int] = field(default_factory=list)
    """steps_by_drafted[n]: verify steps that checked exactly n draft tokens."""

    def __post_init__(self) -> None:
        self.num_accepted_tokens_per_pos = self.num_accepted_tokens_per_pos or [0] * self.max_depth
        self.steps_by_drafted = self.steps_by_drafted or [0] * (self.max_depth + 1)

    def observe(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for pos in range(min(accepted, self.max_depth)):
            self.num_accepted_tokens_per_pos[pos] += 1
        self.steps_by_drafted[min(drafted, self.max_depth)] += 1

    def merge(self, other: PhaseCounters) -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for pos, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[pos] += n
        for n_drafts, n in enumerate(other.steps_by_drafted):
            self.steps_by_drafted[n_drafts] += n

    def as_dict(self) -> dict[str, Any]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "steps_by_drafted": list(self.steps_by_drafted),
        }


@dataclass(slots=True)
class RequestLedger:
    """One engine request as the engine core sees it, from ``add_request`` to its free: its depth
    settings, its counters by phase, its shadow drafts and the adaptive controller's estimates.
    The hook (engine/hook.py) and the controller (engine/controller.py) both work on it."""

    group: str
    depth: int
    """The depth the next step verifies at (an adaptive request's latest choice)."""
    phase: str
    max_depth: int
    adaptive: bool = False
    cap: int = 0
    """The depth set from the front end: a static request's depth, an adaptive one's cap."""
    decided: int = 0
    """Adaptive: the controller's last decided depth (random steps aside)."""
    budget_hold: bool = False
    """Close to its thinking budget: verifies no drafts, whatever the depth (engine/hook.py)."""
    tokens_left: int | None = None
    """Output tokens before its depth stops mattering (its max_tokens, its thinking-budget hold),
    None when no end is known; the hook sets it every step (``depth_tokens_left``)."""
    hold_from: int | None = None
    """Held: the output token its hold began at (``hold_start``); None while not held."""
    held_tokens: int = 0
    """Held: output tokens since its hold began (the hook sets it every step)."""
    max_tokens_left: int | None = None
    """Output tokens before its ``max_tokens`` (None: no limit), set by the hook every step."""
    phases: dict[str, PhaseCounters] = field(default_factory=dict)
    depth_log: list[tuple[int, int, str]] = field(default_factory=list)
    """(engine step, depth or cap, phase) at submission and at every change from the front end."""
    decisions: list[list[Any]] = field(default_factory=list)
    """Adaptive: [engine step, depth, phase, acceptance by position, ms per extra draft] at each
    change of the chosen depth (the first DECISION_LOG_CAP)."""
    decisions_total: int = 0
    explored_steps: int = 0
    tokens_seen: int = 0
    trace: list[tuple[int, int, int, str]] | None = None
    """(engine step, drafted, accepted, phase) per verify step, when asked for."""
    book: ShadowBook = field(default_factory=ShadowBook)
    """Its proposals waiting for the tokens that decide them (shadow drafts: sync scheduling only)."""
    engine_id: str = ""
    """vLLM's id for it in the engine core (a member of ``group``)."""
    proposed: int | None = None
    """Drafts the drafter proposed for the coming step, when known before scheduling (sync
    scheduling; the hook sets it every step); None: unknown."""
    rates: RequestRates | None = None
    """The adaptive controller's estimates of its acceptance (engine/controller.py), restarted
    whenever it enters a phase."""
    rates_phase: str = ""
    """The phase ``rates`` belong to."""
    chosen: int | None = None
    """The controller's last choice for it in ``rates_phase`` (random steps aside)."""

    @property
    def verified_depth(self) -> int:
        """The drafts the next step may verify."""
        return 0 if self.budget_hold else self.depth

    def planned(self) -> tuple[int, bool]:
        """(depth, adaptive) for the coming step: a fixed depth, or an adaptive request's cap. A
        request held at its thinking budget is fixed at 0."""
        if self.budget_hold:
            return 0, False
        return (self.cap, True) if self.adaptive else (self.depth, False)

    def observe(self, step: int, drafted: int, accepted: int) -> None:
        counters = self.phases.get(self.phase)
        if counters is None:
            counters = self.phases[self.phase] = PhaseCounters(self.max_depth)
        counters.observe(drafted, accepted)
        if self.trace is not None:
            self.trace.append((step, drafted, accepted, self.phase))

    def set_mode(self, depth: int, adaptive: bool) -> None:
        self.adaptive = adaptive
        self.cap = self.decided = self.depth = depth

    def choose(
        self, step: int, depth: int, why: Callable[[RequestLedger], list[float]], per_draft_ms: float | None
    ) -> None:
        """The controller's depth for the next step (logged when it changes, with ``why(self)``: the
        estimates it was chosen from, computed only then)."""
        if depth != self.decided or not self.decisions_total:
            self.decisions_total += 1
            if len(self.decisions) < DECISION_LOG_CAP:
                self.decisions.append([step, depth, self.phase, [round(c, 3) for c in why(self)], per_draft_ms])
        self.depth = self.decided = depth


def summarize(ledgers: list[RequestLedger]) -> dict[str, Any]:
    """What callers read: per-phase counters (children of an n>1 request summed)."""
    first = ledgers[0]
    phases: dict[str, PhaseCounters] = {}
    for ledger in ledgers:
        for name, counters in ledger.phases.items():
            phases.setdefault(name, PhaseCounters(first.max_depth)).merge(counters)
    summary: dict[str, Any] = {
        "depth": first.depth,
        "phase": first.phase,
        "phases": {name: c.as_dict() for name, c in phases.items()},
        "depth_log": [list(entry) for entry in first.depth_log],
    }
    if first.adaptive or first.decisions_total:
        summary["decisions"] = first.decisions
        summary["decisions_total"] = first.decisions_total
        summary["explored_steps"] = sum(ledger.explored_steps for ledger in ledgers)
    if first.trace is not None:
        summary["trace"] = [list(entry) for ledger in ledgers for entry in ledger.trace or ()]
    return summary


class SpecLedger:
    """All live requests' depths and counters, plus a bounded mailbox of finished ones.

    Requests are addressed by *group*: the id the front end submitted under.
    vLLM's engine-side ids add a random suffix (and n>1 requests have several
    children), so the group is what a caller can name.
    """

    def __init__(self, max_depth: int, finished_cap: int = 1024) -> None:
        self.max_depth = max_depth
        self.finished_cap = finished_cap
        self._live: dict[str, RequestLedger] = {}
        self._groups: dict[str, list[str]] = {}
        self._finished: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._finishing: dict[str, list[RequestLedger]] = {}
        self.annotations: dict[str, Any] = {}
        """Added to every summary (the step emulation, when one is on)."""

    def register(
        self, engine_id: str, group: str, depth: int, phase: str, step: int, trace: bool, adaptive: bool = False
    ) -> None:
        ledger = RequestLedger(group, validate_depth(depth, self.max_depth), phase, self.max_depth, engine_id=engine_id)
        ledger.set_mode(depth, adaptive)
        ledger.depth_log.append((step, ledger.depth, phase))
        if trace:
            ledger.trace = []
        self._live[engine_id] = ledger
        self._groups.setdefault(group, []).append(engine_id)

    def get(self, engine_id: str) -> RequestLedger | None:
        return self._live.get(engine_id)

    def set_depth(self, group: str, depth: int, phase: str | None, step: int, adaptive: bool = False) -> bool:
        """Apply to every live request of the group; False if there is none.

        ``adaptive``: ``depth`` is a cap and the controller chooses below it."""
        validate_depth(depth, self.max_depth)
        members = self._groups.get(group)
        if not members:
            return False
        for engine_id in members:
            ledger = self._live[engine_id]
            ledger.set_mode(depth, adaptive)
            ledger.phase = phase if phase is not None else ledger.phase
            ledger.depth_log.append((step, depth, ledger.phase))
        return True

    def observe(self, engine_id: str, step: int, drafted: int, accepted: int) -> None:
        ledger = self._live.get(engine_id)
        if ledger is not None:
            ledger.observe(step, drafted, accepted)

    def snapshot(self, group: str) -> dict[str, Any] | None:
        members = self._groups.get(group)
        if members:
            return {**summarize([self._live[e] for e in members] + self._finishing.get(group, [])), **self.annotations}
        return self._finished.get(group)

    def finish(self, engine_id: str) -> None:
        """The engine freed this request (finished or aborted)."""
        ledger = self._live.pop(engine_id, None)
        if ledger is None:
            return
        members = self._groups[ledger.group]
        members.remove(engine_id)
        done = [*self._finishing.pop(ledger.group, []), ledger]
        if members:
            self._finishing[ledger.group] = done
            return
        del self._groups[ledger.group]
        self._finished[ledger.group] = {**summarize(done), **self.annotations}
        while len(self._finished) > self.finished_cap:
            self._finished.popitem(last=False)

    def pop(self, group: str) -> dict[str, Any] | None:
        """Final counters of a finished request, removed from the mailbox."""
        return self._finished.pop(group, None)

    def sizes(self) -> dict[str, int]:
        return {
            "live": len(self._live),
            "groups": len(self._groups),
            "finishing": len(self._finishing),
            "finished_unread": len(self._finished),
        }
