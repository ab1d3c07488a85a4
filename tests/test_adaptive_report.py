"""The adaptive benchmark report pairs policies within a repetition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load.adaptive_report import Board, adaptive_targets, twin_table
from load.policy_report import cost_curve


def cells(table: dict[int, dict[str, float]], conc: int = 1) -> list[dict[str, str]]:
    """rep -> policy -> tok/s, as cells.csv rows."""
    chosen = json.dumps({"reasoning": [3, 0, 0, 1]})
    return [
        {
            "concurrency": str(conc),
            "rep": str(rep),
            "policy": name,
            "tok_s": str(tok_s),
            "chosen": chosen if name == "adaptive" else "{}",
        }
        for rep, row in table.items()
        for name, tok_s in row.items()
    ]


def test_machine_drift_between_repetitions_cancels_in_paired_ratios() -> None:
    # The second repetition ran on a machine twice as slow: every policy halves.
    board = Board(cells({0: {"none": 10.0, "adaptive": 12.0}, 1: {"none": 5.0, "adaptive": 6.0}}))
    paired = board.paired(1, "adaptive", "none")
    assert paired is not None
    assert (paired.mean, paired.low, paired.high) == pytest.approx((1.2, 1.2, 1.2))
    assert board.spread(1, "none") == pytest.approx(5.0 / 7.5)


def test_best_static_is_chosen_by_mean_and_chosen_depths_are_summed() -> None:
    table = {
        0: {"none": 10.0, "fixed-1": 11.0, "map-1-2": 12.0, "adaptive": 12.0},
        1: {"none": 10.0, "fixed-1": 11.0, "map-1-2": 13.0, "adaptive": 12.0},
    }
    lines = adaptive_targets(cells(table, conc=1) + cells(table, conc=4))
    row = lines[2]
    assert row.startswith("| 1 | 2 | 12.00 (0.0%) | 1.200 [1.200, 1.200] | map-1-2 12.50 |")
    assert "| fixed-1 | 1.091 [1.091, 1.091] |" in row
    assert "{'reasoning': [6, 0, 0, 2]}" in row
    assert "fixed-1 1.091 (the best single fixed depth overall: fixed-1)" in lines[-1]


def test_the_window_table_shows_a_depth_known_from_one_stalled_window() -> None:
    """The H200 case (docs/gpu.md, sixth session): depth 0's only window next to depth 1's many."""
    from load.adaptive_report import window_table

    state = {
        "step_depth_windows": [[4, 0, True, 8, 36.2, 149.0]]  # as written before the fixed-request count
        + [[4, 1, False, 8, 12.0 + i, 15.0, 2.0 * i] for i in range(3)]  # ... before the token counts
        + [[4, 2, False, 8, 20.0, 21.0, 0.0, 30.5, 24.0]],
        "step_depth_ms": {"4": [36.2, 13.0, 20.0, None]},
        "step_depth_switch_ms": {"4": 42.4},
    }
    lines = window_table(state)
    assert "| 4 | 0 | after a switch | 1 | 36.2 [36.2, 36.2] | 149.0 | - | - / - | 36.2 |" in lines
    assert "| 4 | 1 | steady | 3 | 13.0 [12.0, 14.0] | 15.0 | 2.0 | - / - | 13.0 |" in lines
    assert "| 4 | 2 | steady | 1 | 20.0 [20.0, 20.0] | 21.0 | 0.0 | 30.5 / 24.0 | 20.0 |" in lines
    assert lines[-1].endswith('{"4": 42.4}')
    shares = window_table({**state, "step_depth_switch_share": {"4": 0.05}})
    assert shares[-1] == 'What a switch adds to a window\'s time, share, by bucket: {"4": 0.05}'


def test_adaptive_is_set_beside_the_a_a_twin_of_the_policy_it_is_compared_with() -> None:
    table = {
        0: {"fixed-1": 10.0, "fixed-1-aa": 11.0, "adaptive": 9.0, "none": 8.0},
        1: {"fixed-1": 20.0, "fixed-1-aa": 18.0, "adaptive": 19.0, "none": 16.0},
    }
    lines = twin_table(cells(table, conc=4))
    assert len(lines) == 3, "one twin: one row"
    assert lines[2].startswith("| 4 | adaptive | fixed-1 | 0.925 [0.900, 0.950] | 0.995 [0.900, 1.100] |")
    assert twin_table(cells({0: {"fixed-1": 10.0, "adaptive": 9.0}})) == [], "no twin, no table"


def test_a_capped_adaptive_policy_is_no_best_static_and_gets_its_own_twin_rows() -> None:
    table = {
        0: {"fixed-1": 10.0, "fixed-1-aa": 10.0, "adaptive": 9.0, "adaptive-1-1": 20.0, "none": 8.0},
        1: {"fixed-1": 10.0, "fixed-1-aa": 10.0, "adaptive": 9.0, "adaptive-1-1": 20.0, "none": 8.0},
    }
    rows = cells(table, conc=16)
    assert "| fixed-1 10.00 |" in adaptive_targets(rows)[2], "adaptive-1-1 is faster, but it is not static"
    lines = twin_table(rows)
    assert [line.split(" | ")[1] for line in lines[2:]] == ["adaptive", "adaptive-1-1"]
    assert "| adaptive-1-1 | fixed-1 | 2.000 [2.000, 2.000] |" in lines[3]


def test_step_costs_split_by_policy_set_one_policys_steps_beside_anothers_of_the_same_shape() -> None:
    # (concurrency, requests, tokens verified, drafts, seconds, policy)
    steps = [
        (16, 16, 32, 16, 0.014, "fixed-1"),
        (16, 16, 32, 16, 0.016, "fixed-1"),
        (16, 16, 32, 16, 0.018, "adaptive"),
        (16, 16, 16, 0, 0.012, "adaptive"),
    ]
    by_policy = {(r["policy"], r["tokens_per_step"]): r for r in cost_curve(steps, by_policy=True)}
    assert by_policy[("fixed-1", 32)]["mean_ms"] == pytest.approx(15.0)
    assert by_policy[("adaptive", 32)]["mean_ms"] == pytest.approx(18.0)
    assert by_policy[("adaptive", 16)]["steps"] == 1 and ("fixed-1", 16) not in by_policy
    pooled = {r["tokens_per_step"]: r for r in cost_curve(steps)}
    assert "policy" not in pooled[32] and pooled[32]["steps"] == 3
    assert pooled[32]["mean_ms"] == pytest.approx(16.0)


def test_adaptive_under_caps_is_parsed_and_named_for_its_caps() -> None:
    from load.bench_policies import parse_policies

    policies = parse_policies("0:0,adaptive,adaptive@1:1,1:1=aa", max_depth=3)
    assert [p.name for p in policies] == ["none", "adaptive", "adaptive-1-1", "fixed-1-aa"]
    capped = policies[2]
    assert capped.adaptive and (capped.reasoning, capped.answer) == (1, 1)
    with pytest.raises(SystemExit):
        parse_policies("adaptive@1:1=aa", max_depth=3)
    with pytest.raises(SystemExit):
        parse_policies("adaptive@4:1", max_depth=3)


def test_an_adaptive_arm_is_the_adaptive_policy_again_under_its_own_settings() -> None:
    from load.bench_policies import parse_args

    cfg = parse_args(["--policies", "1:1,adaptive,adaptive=noexp", "--arm", 'noexp={"explore_share": 0}'])
    assert cfg.arms == {"noexp": {"explore_share": 0}}
    from load.bench_policies import parse_policies

    arm = parse_policies(cfg.policies, 3, cfg.arms)[2]
    assert arm.name == "adaptive-noexp" and arm.adaptive and (arm.reasoning, arm.answer) == (3, 3)
    for bad in (
        ["--policies", "adaptive=noexp"],  # no --arm names its settings
        ["--policies", "adaptive", "--arm", "noexp"],
        ["--policies", "adaptive", "--arm", "noexp=[1]"],
        ["--policies", "adaptive", "--arm", "noexp={nope"],
    ):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_held_table_weighs_windows_by_steps_in_quarters_of_the_bucket() -> None:
    """Depth 0 with most of a batch of 64 held against depth 1 with few (docs/gpu.md, the
    twenty-second session): tokens per ms summed over steps, not averaged over windows."""
    from load.adaptive_report import held_table

    state = {
        "step_depth_windows": [
            [6, 0, True, 8, 10.0, 12.0, 60.0, 64.0, 40.0],  # 48-64 held: 8 steps, 40 tok in 10 ms
            [6, 0, False, 2, 20.0, 22.0, 50.0, 64.0, 64.0],  # 48-64 held: 2 steps, 64 tok in 20 ms
            [6, 1, False, 4, 12.0, 13.0, 3.0, 90.0, 60.0],  # 0-16 held
            [4, 1, False, 8, 12.0, 13.0, 2.0],  # before tokens were recorded: left out
        ],
    }
    lines = held_table(state)
    assert lines[2] == "| 6 | 0-25% of 64 | 1 | 1 | 4 | 5.00 |"
    # (8 * 40 + 2 * 64) tokens over (8 * 10 + 2 * 20) ms
    assert lines[3] == f"| 6 | 75-100% of 64 | 0 | 2 | 10 | {(8 * 40 + 2 * 64) / (8 * 10 + 2 * 20):.2f} |"
    assert len(lines) == 4
    assert held_table({"step_depth_windows": [[4, 1, False, 8, 12.0, 13.0, 2.0]]}) == []


def test_the_mix_table_prices_every_policys_steps_at_the_pooled_times(tmp_path: Path) -> None:
    """A twin on a slow minute reads mix 1.000 and the slowness as speed; a policy running deeper,
    dearer steps at the same speed reads its choices' cost as mix."""
    from load.adaptive_report import mix_table
    from load.policy_report import cost_curve, write_csv

    steps = [
        *[(16, 16, 32, 16, 0.010, "fixed-1")] * 10,
        *[(16, 16, 32, 16, 0.012, "fixed-1-aa")] * 10,  # the same steps, the host 20% slower
        *[(16, 16, 32, 16, 0.011, "adaptive")] * 5,
        *[(16, 16, 48, 32, 0.015, "adaptive")] * 4,
        (16, 2, 8, 6, 0.012, "adaptive"),  # its last two requests, alone in a step
    ]
    write_csv(tmp_path / "cost_curve.csv", cost_curve(steps))
    write_csv(tmp_path / "cost_by_policy.csv", cost_curve(steps, by_policy=True))
    rows = {line.split(" | ")[1]: line.strip("| ").split(" | ") for line in mix_table(tmp_path)[2:]}
    assert rows["fixed-1-aa"][2:] == ["1.000", "1.000", "1.000", "+0.000", "0.833", "0.833"]
    # pooled: 32 tokens at (100 + 120 + 55) / 25 ms, 48 at 15, 8 (two requests left) at 12;
    # fixed-1 priced 10 x p32, adaptive 5 x p32 + 60 at full batch and 12 in its drain.
    p32 = (100 + 120 + 55) / 25
    adaptive = rows["adaptive"][2:]
    assert adaptive[0] == "1.000" and adaptive[1] == f"{10 * p32 / (5 * p32 + 60 + 12):.3f}"
    assert adaptive[2] == f"{10 * p32 / (5 * p32 + 60):.3f}" and adaptive[3] == f"{+12 / (10 * p32):+.3f}"
    assert adaptive[5] == f"{100 / (55 + 60 + 12):.3f}"  # the timed steps' own total times
    assert "(by tokens)" in mix_table(tmp_path)[0]
    # With requests per step (cost_by_batch.csv) a full batch is one with every slot busy: the same here.
    write_csv(tmp_path / "cost_by_batch.csv", cost_curve(steps, by_policy=True, by_requests=True))
    lines = mix_table(tmp_path)
    assert "(by tokens)" not in lines[0]
    assert {line.split(" | ")[1]: line.strip("| ").split(" | ") for line in lines[2:]}["adaptive"][2:] == adaptive
    # A depth-0 step of 15 requests (15 tokens) is drain by requests, as by tokens; a depth-1 one (30) only by requests.
    steps.append((16, 15, 30, 15, 0.011, "adaptive"))
    write_csv(tmp_path / "cost_curve.csv", cost_curve(steps))
    write_csv(tmp_path / "cost_by_batch.csv", cost_curve(steps, by_policy=True, by_requests=True))
    write_csv(tmp_path / "cost_by_policy.csv", cost_curve(steps, by_policy=True))
    by_requests = mix_table(tmp_path)[2:]
    (tmp_path / "cost_by_batch.csv").unlink()
    by_tokens = mix_table(tmp_path)[2:]
    drain = {line.split(" | ")[1]: float(line.split(" | ")[5]) for line in by_requests}
    assert drain["adaptive"] > {line.split(" | ")[1]: float(line.split(" | ")[5]) for line in by_tokens}["adaptive"]
    assert mix_table(tmp_path / "missing") == []


def test_the_drain_table_counts_a_cells_steps_with_slots_free(tmp_path: Path) -> None:
    """Per cell: steps with every slot busy, steps with fewer requests than slots, the drain beyond
    fixed-1's, and the tokens verified per request a step in each."""
    from load.adaptive_report import drain_table
    from load.policy_report import write_csv

    steps = [
        *[(4, 4, 8, 4, 0.010, "fixed-1")] * 20,  # two cells: 10 full steps each, depth 1
        *[(4, 2, 4, 2, 0.008, "fixed-1")] * 4,  # and 2 drain steps each
        *[(4, 4, 4, 0, 0.009, "adaptive")] * 16,  # two cells: 8 full steps each at depth 0
        *[(4, 4, 16, 12, 0.014, "adaptive")] * 4,  # and 2 at depth 3
        *[(4, 1, 1, 0, 0.007, "adaptive")] * 10,  # 5 drain steps each, one request at depth 0
    ]
    write_csv(tmp_path / "cost_by_batch.csv", cost_curve(steps, by_policy=True, by_requests=True))
    write_csv(
        tmp_path / "cells.csv",
        [{"concurrency": 4, "policy": p, "rep": rep} for p in ("fixed-1", "adaptive") for rep in (0, 1)],
    )
    rows = {line.split(" | ")[1]: line.strip("| ").split(" | ")[2:] for line in drain_table(tmp_path)[2:]}
    assert rows["fixed-1"] == ["10.0", "2.0", "+0.0", "0.0", "0", "2.00", "2.00"]  # two of four busy: no tail
    assert rows["adaptive"] == ["10.0", "5.0", "+3.0", "5.0", "35", f"{(16 * 4 + 4 * 16) / (20 * 4):.2f}", "1.00"]
    (tmp_path / "cells.csv").unlink()
    assert drain_table(tmp_path) == []
