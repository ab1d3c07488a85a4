"""Speculation never changes what a sampled request can return: the real engine at temperature 1.

Every arm samples the same prompt 400 times (seeded, each arm its own seeds) through the server,
under one depth policy; the arms' output distributions are compared with a permutation test on
their total-variation distance (load/distribution.py; its power on a broken test double is in
tests/test_distribution_power.py: a TV shift of 0.15 is caught in 37 of 40 runs at this size).
An arm that fails is sampled again, with fresh seeds, four times as large, beside a fresh depth-0
arm, and that comparison decides: three arms at p < 0.01 fail a sound engine in about 3% of runs
(CI, 2026-12-03: adaptive at p 0.0095; at 1,600 samples per arm it read p 0.84,
load/results/fidelity-mixed-depths/), a shifted one fails both stages.
Depth 0 verifies no drafts, so its tokens come from vLLM's plain sampler: it stands for
speculation off, and a second depth-0 arm is the A/A control. Rare outputs are pooled so the
comparison looks at the outcomes each arm sees often enough to compare.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from load.bench_fidelity import PROMPT, sample_arm
from load.distribution import permutation_p_value, tv_distance

pytestmark = pytest.mark.engine

N = 400
ALPHA = 0.01
MIN_COUNT = 10
"""Outputs seen fewer times than this over all arms are pooled into one outcome."""
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"


def _drafted(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(DRAFT_TOKENS + "{"))


def _arm(
    base_url: str, model: str, first_seed: int, phasespec: dict[str, Any] | None, n: int = N
) -> tuple[list[str], float]:
    """``n`` seeded samples of four tokens; returns their texts and how many drafts vLLM verified."""
    before = _drafted(base_url)
    texts = sample_arm(base_url, n, first_seed, [phasespec], 4, model=model)
    return texts, _drafted(base_url) - before


def _pooled(*arms: list[str]) -> list[list[str]]:
    counts = Counter(text for arm in arms for text in arm)
    return [[text if counts[text] >= MIN_COUNT else "<rare>" for text in arm] for arm in arms]


def _depths(depth: int) -> dict[str, Any]:
    return {"depths": {"reasoning": depth, "answer": depth, "tool_call": depth}}


POLICIES: dict[str, dict[str, Any] | None] = {
    "depth 0": _depths(0),
    "depth 0 (A/A)": _depths(0),
    "depth 3": _depths(3),
    "adaptive": {"policy": "adaptive"},
}


@pytest.fixture(scope="module")
def arms(base_url: str, model_name: str) -> dict[str, tuple[list[str], float]]:
    return {name: _arm(base_url, model_name, 10_000 * k, policy) for k, (name, policy) in enumerate(POLICIES.items())}


def _compared(reference: list[str], texts: list[str]) -> tuple[float, float, int]:
    a, b = _pooled(reference, texts)
    return permutation_p_value(a, b), tv_distance(a, b), len(set(a) | set(b))


@pytest.mark.parametrize("arm", ["depth 0 (A/A)", "depth 3", "adaptive"])
def test_sampled_outputs_follow_the_same_distribution_at_every_depth(
    arms: dict[str, tuple[list[str], float]], arm: str, base_url: str, model_name: str
) -> None:
    reference, _ = arms["depth 0"]
    texts, drafted = arms[arm]
    p, tv, outcomes = _compared(reference, texts)
    print(f"{arm} vs depth 0: TV {tv:.3f}, p {p:.4f}, {outcomes} outcomes, {drafted:.0f} drafts")
    if arm != "depth 0 (A/A)":
        # A quarter draft per sample at least (a warm adaptive controller may verify few).
        assert drafted > N // 4, "the arm must verify drafts for the comparison to mean anything"
    else:
        assert drafted == 0
    if p < ALPHA:  # the second stage decides (module docstring)
        seed = 1_000_000 * (1 + list(POLICIES).index(arm))
        reference, _ = _arm(base_url, model_name, seed, POLICIES["depth 0"], 4 * N)
        texts, _ = _arm(base_url, model_name, seed + 500_000, POLICIES[arm], 4 * N)
        p, tv, outcomes = _compared(reference, texts)
        print(f"{arm} vs depth 0, again at {4 * N} samples: TV {tv:.3f}, p {p:.4f}, {outcomes} outcomes")
    assert p >= ALPHA, f"{arm}: the output distribution moved (TV {tv:.3f}, p {p:.4f})"


def test_a_seeded_request_repeats_under_the_same_depth_policy(base_url: str, model_name: str) -> None:
    """vLLM's promise for ``seed``, kept through the hook: same seed and depth policy, same text.
    A different depth draws the same distribution from different random numbers, so a seeded
    request's text may change with its depth (printed, not asserted)."""

    def texts(depth: int) -> list[str]:
        body = {
            "model": model_name, "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "n": 8, "seed": 7,
            "phasespec": _depths(depth),
        }  # fmt: skip
        response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
        response.raise_for_status()
        return [choice["text"] for choice in response.json()["choices"]]

    at_3, at_0 = texts(3), texts(0)
    assert texts(3) == at_3 and texts(0) == at_0
    changed = sum(a != b for a, b in zip(at_0, at_3, strict=True))
    print(f"same seeds at depth 0 and depth 3: {changed} of 8 texts differ")


def test_seeded_requests_whose_prompts_are_chunked_complete_and_draw_as_unchunked(
    base_url: str, model_name: str
) -> None:
    """Two seeded requests of 1,100 prompt tokens arrive while a 2,000-token prefill runs, so the
    next step takes both and, at 2,048 tokens a step, the second only in part: its first draw is
    discarded. vLLM rewinds a seeded request's generator there, which killed the CPU engine
    (engine/vllm_fixes.py). Each then draws what its seed draws alone."""
    prompts = [[1000 + (7 * i + 13 * k) % 5000 for i in range(1100)] for k in (1, 2)]  # ids no other test sends

    def texts(prompt: list[int], seed: int, max_tokens: int = 8) -> str:
        body = {"model": model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed}
        response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["text"])

    with ThreadPoolExecutor(3) as pool:
        blocker = pool.submit(texts, [2000 + i % 3000 for i in range(2000)], 1, 1)
        time.sleep(0.5)
        together = list(pool.map(texts, prompts, (41, 42)))
        blocker.result()
    assert httpx.get(f"{base_url}/health").status_code == 200
    assert together == [texts(prompts[0], 41), texts(prompts[1], 42)]
