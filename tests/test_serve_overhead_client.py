"""load/bench_serve_overhead.py's flags for vLLM's own benchmark client (no engine)."""

from __future__ import annotations

from pathlib import Path


def test_the_serve_overhead_client_sends_a_thinking_budget_only_when_asked(tmp_path: Path) -> None:
    """With a budget phasespec's guard verifies no drafts near it and plain vLLM keeps drafting
    (docs/gpu.md), so the default comparison sends none; vLLM's own client parses the flags."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from load.bench_serve_overhead import client_argv, parse_args

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    plain = parser.parse_args(client_argv("http://x", tmp_path, 4, parse_args([])))
    assert plain.extra_body is None and plain.num_prompts == 48 and plain.max_concurrency == 4
    budget = parser.parse_args(client_argv("http://x", tmp_path, 1, parse_args(["--thinking-budget", "32"])))
    assert budget.extra_body == {"thinking_token_budget": 32}


def test_without_a_budget_phasespec_sets_none_either() -> None:
    """The embedded model's default budget (48) would make phasespec hold drafts where plain vLLM,
    which has no default, keeps drafting; the phasespec servers' flags turn it off."""
    from config import Settings
    from engine.args import request_defaults
    from load.bench_serve_overhead import parse_args, phasespec_flags

    flags = phasespec_flags(parse_args([]))
    assert request_defaults(Settings.from_command_line(flags)).thinking_token_budget is None
    assert phasespec_flags(parse_args(["--thinking-budget", "32"])) == []
