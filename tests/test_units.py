"""Pure logic: settings, version pin, payload edits."""

from __future__ import annotations

import json

import pytest

from config import Settings
from engine.hook import VllmVersionError, check_vllm_version
from proxy.chat_rewrite import alias_reasoning_content, edit_sse_event


def test_unknown_flags_pass_through_to_vllm() -> None:
    settings = Settings(
        _cli_parse_args=["--model", "m", "--server.port", "9001", "--tensor-parallel-size", "2", "--enforce-eager"]
    )
    assert settings.model == "m"
    assert settings.server.port == 9001
    assert settings.vllm_args == ["--tensor-parallel-size", "2", "--enforce-eager"]


def test_env_sets_nested_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASESPEC_SERVER__PORT", "8123")
    monkeypatch.setenv("PHASESPEC_ENGINE__KV_CACHE_GIB", "1.5")
    settings = Settings()
    assert settings.server.port == 8123
    assert settings.engine.kv_cache_gib == 1.5


def test_bad_setting_is_a_validation_error() -> None:
    with pytest.raises(ValueError, match="log level"):
        Settings(server={"log_level": "loud"})


@pytest.mark.parametrize("found", ["0.31.1", "0.33.0", "0.32.1+cpu"])
def test_other_vllm_versions_fail_loudly(found: str) -> None:
    with pytest.raises(VllmVersionError, match=r"0\.32\.0"):
        check_vllm_version(found)


@pytest.mark.parametrize("found", ["0.32.0", "0.32.0+cpu"])
def test_pinned_vllm_version_passes(found: str) -> None:
    check_vllm_version(found)


def test_installed_vllm_is_the_pinned_one() -> None:
    check_vllm_version()


def test_reasoning_is_aliased_in_messages_and_deltas() -> None:
    payload = {
        "choices": [
            {"message": {"reasoning": "why", "content": "x"}},
            {"delta": {"reasoning": "step"}},
            {"delta": {"content": "answer"}},
        ]
    }
    alias_reasoning_content(payload)
    assert payload["choices"][0]["message"]["reasoning_content"] == "why"
    assert payload["choices"][1]["delta"]["reasoning_content"] == "step"
    assert "reasoning_content" not in payload["choices"][2]["delta"]


def test_sse_edit_leaves_done_and_comments_alone() -> None:
    edits = [alias_reasoning_content]
    assert edit_sse_event(b"data: [DONE]", edits) == b"data: [DONE]"
    assert edit_sse_event(b": keep-alive", edits) == b": keep-alive"
    edited = edit_sse_event(b'data: {"choices":[{"delta":{"reasoning":"r"}}]}', edits)
    assert json.loads(edited[6:])["choices"][0]["delta"]["reasoning_content"] == "r"
