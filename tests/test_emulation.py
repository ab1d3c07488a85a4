"""The step-cost emulation's spec parsing and targets (pure)."""

from __future__ import annotations

import pytest

from engine.emulation import EmulationError, PadCounter, StepEmulation


def test_profile_and_linear_spec_give_the_same_moe_offload_shape() -> None:
    profile = StepEmulation.parse("moe-offload")
    linear = StepEmulation.parse("7+48*tokens")
    for tokens in (1, 2, 3, 4):
        assert profile.target_s(tokens) == linear.target_s(tokens) == pytest.approx((7 + 48 * tokens) / 1e3)
    assert StepEmulation.parse("moe-offload", scale=2).target_s(3) == pytest.approx(2 * 0.151)


@pytest.mark.parametrize("spec", ["", "fast", "7*tokens", "7+48*steps", "-1+2*tokens"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(EmulationError):
        StepEmulation.parse(spec)
    with pytest.raises(EmulationError):
        StepEmulation.parse("moe-offload", scale=0)


def test_overrun_share() -> None:
    pads = PadCounter(padded=99, overrun=1)
    assert pads.as_dict() == {"padded_steps": 99, "overrun_steps": 1, "overrun_share": 0.01}
