"""phasespec's Prometheus metrics, served on /metrics next to vLLM's own."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from prometheus_client import Counter, Gauge, Histogram


@dataclass(frozen=True, slots=True)
class PhaseMetrics:
    tokens: Counter
    num_drafts: Counter
    num_draft_tokens: Counter
    num_accepted_tokens: Counter
    switches: Counter
    decode_rate: Histogram
    acceptance: Gauge
    phase_rate: Gauge
    depth_steps: Counter
    cost_per_draft: Gauge


@lru_cache(maxsize=1)
def phase_metrics() -> PhaseMetrics:
    """Created once per process, in vLLM's registry (so /metrics shows them)."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    registry = get_prometheus_registry()
    labels = ["phase"]
    return PhaseMetrics(
        tokens=Counter("phasespec_tokens", "Generated tokens by phase", labels, registry=registry),
        # vLLM's names (vllm:spec_decode_num_drafts, ...), by phase.
        num_drafts=Counter(
            "phasespec_spec_decode_num_drafts", "Verify steps with drafts, by phase", labels, registry=registry
        ),
        num_draft_tokens=Counter(
            "phasespec_spec_decode_num_draft_tokens", "Draft tokens verified, by phase", labels, registry=registry
        ),
        num_accepted_tokens=Counter(
            "phasespec_spec_decode_num_accepted_tokens", "Draft tokens accepted, by phase", labels, registry=registry
        ),
        switches=Counter(
            "phasespec_depth_switches", "Depth changes, by the phase switched to", labels, registry=registry
        ),
        decode_rate=Histogram(
            "phasespec_decode_tokens_per_second",
            "Per-request decode rate within a phase",
            labels,
            buckets=(1, 2, 5, 10, 15, 20, 30, 40, 60, 80, 120, 200, 400),
            registry=registry,
        ),
        acceptance=Gauge(
            "phasespec_acceptance_by_position",
            "Estimated probability that drafts 1..position are all accepted, by phase",
            ["phase", "position"],
            registry=registry,
        ),
        phase_rate=Gauge(
            "phasespec_phase_tokens_per_second", "Tokens generated per second, by phase", labels, registry=registry
        ),
        depth_steps=Counter(
            "phasespec_depth_steps", "Engine steps at each depth, by phase", ["phase", "depth"], registry=registry
        ),
        cost_per_draft=Gauge(
            "phasespec_cost_per_draft_ms",
            "Estimated step time of one more verified draft token, by batch-size bucket",
            ["batch"],
            registry=registry,
        ),
    )
