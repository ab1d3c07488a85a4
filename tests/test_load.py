"""A short, bounded Locust run against the session's server."""

from __future__ import annotations

from pathlib import Path

import pytest

from load.run_load import parse_args, run

pytestmark = pytest.mark.engine


def test_short_locust_run_reports_stream_and_phase_metrics(base_url: str, tmp_path: Path) -> None:
    summary = run(parse_args(["--host", base_url, "--users", "2", "--seconds", "30", "--out", str(tmp_path)]))
    assert summary["requests"] >= 2
    assert summary["failures"] == 0 and summary["server_errors_5xx"] == 0
    assert summary["leaked_requests"] == 0
    for name in (
        "ttft",
        "time_to_first_answer",
        "inter_token_gap_mean",
        "inter_token_gap_max",
        "reasoning_tokens",
        "answer_tokens",
        "reasoning_acceptance_x1000",
    ):
        assert summary["metrics"].get(name, {}).get("count", 0) > 0, name
    assert summary["metrics"]["reasoning_tokens"]["mean_length"] > 0
    assert (tmp_path / "locust_stats.csv").exists()
