"""Per-request phase tracking, depth decisions and the finished-request report.

``PhasespecLLM.generate`` hands every engine output to the request's
observer; the observer tracks the phase on token ids, says when the depth
must change (the engine applies it through the hook) and, at the end, turns
the hook's exact counters into the canonical log line, Prometheus metrics and,
when the client asked, the stats block of the response.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams

from engine.llm import SpecRequest
from engine.spec_stats import PHASES
from proxy.metrics import phase_metrics
from proxy.phase_plan import PhasePlan
from proxy.phases import ForcedToolCall, ParserTracker, Phase, PhaseTracker
from proxy.policy import PhaseDepths, choose_depth

log = structlog.get_logger("phasespec.request")

# Keys the request-body middleware (proxy/overrides.py) puts in vllm_xargs.
XARG_DEPTH = "phasespec_depth_"
XARG_STATS = "phasespec_stats"
XARG_EXPECT_USAGE = "phasespec_expect_usage"
XARG_POLICY = "phasespec_policy"
XARG_FORCED_TOOL = "phasespec_forced_tool"
"""Set by proxy/body.py on a chat request whose tool_choice forces a tool call."""


class StatsBoard:
    """What the response middleware adds to a finished request's payloads: the
    reports clients asked for, and every request's reasoning token count (for
    ``usage.completion_tokens_details.reasoning_tokens`` where vLLM has none)."""

    def __init__(self, cap: int = 1024) -> None:
        self.cap = cap
        self._reports: OrderedDict[str, tuple[dict[str, Any], bool]] = OrderedDict()
        self._reasoning: OrderedDict[str, int] = OrderedDict()

    def note_reasoning(self, request_id: str, tokens: int) -> None:
        self._reasoning[request_id] = tokens
        while len(self._reasoning) > self.cap:
            self._reasoning.popitem(last=False)

    def take_reasoning(self, request_id: str) -> int | None:
        return self._reasoning.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """The response ended: drop whatever was not delivered (a stream without usage)."""
        self._reasoning.pop(request_id, None)

    def put(self, request_id: str, report: dict[str, Any], expect_usage: bool) -> None:
        self._reports[request_id] = (report, expect_usage)
        while len(self._reports) > self.cap:
            self._reports.popitem(last=False)

    def take(self, request_id: str, has_usage: bool, is_last: bool) -> dict[str, Any] | None:
        """The report, if this payload is where it belongs (then it is removed)."""
        entry = self._reports.get(request_id)
        if entry is None or not (has_usage or (is_last and not entry[1])):
            return None
        del self._reports[request_id]
        return entry[0]

    def __len__(self) -> int:
        return len(self._reports) + len(self._reasoning)


def phase_report(counters: dict[str, Any] | None) -> dict[str, Any]:
    """Rates from the hook's counters (vLLM's definitions: the bonus token is
    not an accepted draft; mean acceptance length includes it)."""
    counters = counters or {}
    steps, drafted, accepted = (
        int(counters.get(k, 0)) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    )
    return {
        "num_drafts": steps,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "mean_acceptance_length": round(1 + accepted / steps, 4) if steps else None,
        "num_accepted_tokens_per_pos": counters.get("num_accepted_tokens_per_pos", []),
        "steps_by_drafted": counters.get("steps_by_drafted", []),
    }


@dataclass(slots=True)
class RequestObserver:
    request_id: str
    model: str
    tracker: PhaseTracker | ParserTracker | ForcedToolCall
    depths: PhaseDepths | None
    max_depth: int
    board: StatsBoard | None
    usage: StatsBoard | None = None
    """Where the reasoning count goes for the response's usage block."""
    single: bool = True
    """One completion (n == 1): the tracked count is the response's."""
    expect_usage: bool = False
    cumulative: bool = False
    text_seen: int = 0
    started: float = field(default_factory=time.monotonic)
    depth: int = 0
    first_token_at: float | None = None
    first_answer_at: float | None = None
    last_at: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    """vLLM's: None for EOS, the token id for a stop token, the string for a stop string."""
    decode_s: dict[Phase, float] = field(default_factory=lambda: dict.fromkeys(Phase, 0.0))
    decode_tokens: dict[Phase, int] = field(default_factory=lambda: dict.fromkeys(Phase, 0))
    timeline: list[tuple[float, str, int]] = field(default_factory=list)

    @property
    def adaptive(self) -> bool:
        return self.depths is not None and self.depths.adaptive

    @property
    def reasoning_tokens(self) -> int:
        """Tokens of reasoning text. A response that stops inside its reasoning on EOS or a stop
        token id ends on a token the tracker counted as reasoning, but it is no text."""
        count = self.tracker.reasoning_tokens
        ended_on_token = self.finish_reason == "stop" and not isinstance(self.stop_reason, str)
        if ended_on_token and self.tracker.phase is Phase.REASONING:
            count -= 1
        return max(count, 0)

    def start(self) -> SpecRequest:
        self.depth = choose_depth(self.tracker.phase, self.depths, self.max_depth)
        self.timeline.append((0.0, self.tracker.phase.value, self.depth))
        return SpecRequest(depth=self.depth, phase=self.tracker.phase.value, adaptive=self.adaptive)

    def on_output(self, output: RequestOutput) -> tuple[int, str, bool] | None:
        """Feed one engine output; returns (depth or cap, phase, adaptive) at a phase change.

        The hook tags counters with the phase, and an adaptive request restarts
        from the new phase's estimates there."""
        # n>1: the first completion steers the group (a delta may carry only others).
        completion = next((c for c in output.outputs if c.index == 0), None)
        if completion is None:
            return None
        if completion.finish_reason is not None:
            self.finish_reason = completion.finish_reason
            self.stop_reason = completion.stop_reason
        ids = list(completion.token_ids)
        text = completion.text or ""
        if self.cumulative:
            ids = ids[self.tracker.seen :]
            text, self.text_seen = text[self.text_seen :], len(text)
        if not ids:
            return None
        now = time.monotonic()
        before = dict(self.tracker.tokens)
        changes = self.tracker.feed(ids, text)
        added = {p: n - before[p] for p, n in self.tracker.tokens.items()}
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_at is not None:
            # The time since the last output went into this delta's tokens.
            for phase, n in added.items():
                if n:
                    self.decode_s[phase] += (now - self.last_at) * n / len(ids)
                    self.decode_tokens[phase] += n
        self.last_at = now
        if self.first_answer_at is None and (added[Phase.ANSWER] or added[Phase.TOOL_CALL]):
            self.first_answer_at = now
        if not changes:
            return None
        phase = self.tracker.phase
        depth = choose_depth(phase, self.depths, self.max_depth)
        self.timeline.append((round(now - self.started, 4), phase.value, depth))
        if depth != self.depth:
            phase_metrics().switches.labels(phase.value).inc()
        self.depth = depth
        return depth, phase.value, self.adaptive

    def finish(self, spec_stats: dict[str, Any] | None, aborted: bool) -> dict[str, Any]:
        counters = (spec_stats or {}).get("phases", {})
        phases: dict[str, Any] = {}
        metrics = phase_metrics()
        for phase in Phase:
            tokens = self.tracker.tokens[phase]
            spec = phase_report(counters.get(phase.value))
            if not tokens and not spec["num_drafts"]:
                continue
            seconds = self.decode_s[phase]
            rate = self.decode_tokens[phase] / seconds if seconds > 0 else None
            phases[phase.value] = {
                "tokens": tokens,
                "duration_s": round(seconds, 4),
                "decode_tok_s": round(rate, 2) if rate is not None else None,
                **spec,
            }
            metrics.tokens.labels(phase.value).inc(tokens)
            metrics.num_drafts.labels(phase.value).inc(spec["num_drafts"])
            metrics.num_draft_tokens.labels(phase.value).inc(spec["num_draft_tokens"])
            metrics.num_accepted_tokens.labels(phase.value).inc(spec["num_accepted_tokens"])
            if rate is not None:
                metrics.decode_rate.labels(phase.value).observe(rate)
        report = {
            "request_id": self.request_id,
            "model": self.model,
            "finish_reason": "abort" if aborted else self.finish_reason,
            "duration_s": round(time.monotonic() - self.started, 4),
            "ttft_s": _since(self.started, self.first_token_at),
            "time_to_first_answer_s": _since(self.started, self.first_answer_at),
            "phases": phases,
            "reasoning_tokens": self.reasoning_tokens,
            "policy": "adaptive" if self.adaptive else ("static" if self.depths is not None else "off"),
            "depth_timeline": [list(entry) for entry in self.timeline],
        }
        for key in ("decisions", "decisions_total", "explored_steps", "emulation", "engine_rank"):
            if spec_stats and key in spec_stats:
                report[key] = spec_stats[key]
        log.info("request_finished", **report)
        if self.board is not None and not aborted:
            self.board.put(self.request_id, report, self.expect_usage)
        # Only chat completions report reasoning in usage; their engine request id
        # is the response id (completions add a per-prompt suffix).
        if self.usage is not None and not aborted and self.single and self.request_id.startswith("chatcmpl-"):
            self.usage.note_reasoning(self.request_id, self.reasoning_tokens)
        return report


def _since(start: float, at: float | None) -> float | None:
    return round(at - start, 4) if at is not None else None


@dataclass(slots=True)
class ObserverFactory:
    """Builds one observer per engine request, from settings and the request's overrides."""

    model: str
    phases: PhasePlan
    depths: PhaseDepths | None
    max_depth: int
    board: StatsBoard
    policies: dict[str, PhaseDepths | None] = field(default_factory=dict)
    """The server's settings as each policy, for requests that ask for one."""

    def __call__(self, request_id: str, params: SamplingParams, reasoning_ended: bool | None) -> RequestObserver:
        xargs = params.extra_args or {}
        depths = self.depths
        policy = xargs.get(XARG_POLICY)
        if policy in self.policies:
            depths = self.policies[policy]
        override: dict[str, Any] = {
            name: int(xargs[XARG_DEPTH + name]) for name in PHASES if XARG_DEPTH + name in xargs
        }
        if override:
            depths = replace(depths or PhaseDepths(), **override)
        tracker = self.phases.tracker(reasoning_ended)
        return RequestObserver(
            request_id=request_id,
            model=self.model,
            tracker=ForcedToolCall(tracker) if xargs.get(XARG_FORCED_TOOL) else tracker,
            depths=depths,
            max_depth=self.max_depth,
            board=self.board if xargs.get(XARG_STATS) else None,
            usage=self.board,
            single=params.n == 1,
            expect_usage=bool(xargs.get(XARG_EXPECT_USAGE)),
            cumulative=params.output_kind == RequestOutputKind.CUMULATIVE,
        )
