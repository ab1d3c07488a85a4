"""Settings, the command line and vLLM flags (what reaches vLLM, what is refused), and payload edits: pure logic."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from config import Settings
from proxy.chat_rewrite import alias_reasoning_content, edit_sse_event


def test_unknown_flags_pass_through_to_vllm() -> None:
    settings = Settings(
        _cli_parse_args=["--model", "m", "--server.port", "9001", "--tensor-parallel-size", "2", "--enforce-eager"]
    )
    assert settings.model == "m"
    assert settings.server.port == 9001
    assert settings.vllm_args == ["--tensor-parallel-size", "2", "--enforce-eager"]


def test_vllm_flags_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 2})
    monkeypatch.setenv("PHASESPEC_VLLM_ARGS", json.dumps(["--speculative-config", spec]))
    assert Settings().vllm_args == ["--speculative-config", spec]
    monkeypatch.setenv("PHASESPEC_VLLM_ARGS", "--enforce-eager")
    with pytest.raises(ValueError, match="JSON list of strings"):
        Settings()


def test_the_command_takes_vllm_flags_from_the_environment_then_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Settings.from_command_line is what proxy/cli.py builds the server's settings with.
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 2})
    monkeypatch.setenv("PHASESPEC_VLLM_ARGS", json.dumps(["--speculative-config", spec]))
    assert Settings.from_command_line([]).vllm_args == ["--speculative-config", spec]
    assert Settings.from_command_line(["--server.port", "9001", "--max-model-len", "512"]).vllm_args == [
        "--speculative-config",
        spec,
        "--max-model-len",
        "512",
    ]
    monkeypatch.setenv("PHASESPEC_VLLM_ARGS", "--enforce-eager")
    with pytest.raises(ValueError, match="JSON list of strings"):
        Settings.from_command_line([])


def test_env_sets_nested_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASESPEC_SERVER__PORT", "8123")
    monkeypatch.setenv("PHASESPEC_ENGINE__KV_CACHE_GIB", "1.5")
    settings = Settings()
    assert settings.server.port == 8123
    assert settings.engine.kv_cache_gib == 1.5


def test_bad_setting_is_a_validation_error() -> None:
    with pytest.raises(ValueError, match="log level"):
        Settings(server={"log_level": "loud"})


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


def test_adaptive_policy_caps_only_the_phases_the_user_set() -> None:
    from proxy.app import phase_depths
    from proxy.policy import PhaseDepths

    static = Settings(_cli_parse_args=["--phases.answer", "3"])
    assert phase_depths(static) == PhaseDepths(reasoning=1, answer=3, tool_call=None)
    adaptive = Settings(_cli_parse_args=["--phases.policy", "adaptive", "--phases.reasoning", "1"])
    assert phase_depths(adaptive) == PhaseDepths(reasoning=1, answer=None, tool_call=None, adaptive=True)
    # A request may ask for the other policy; the server's own map stays its static one.
    assert phase_depths(adaptive, "static") == PhaseDepths(reasoning=1, answer=2, tool_call=None)
    off = Settings.from_command_line(["--phases.policy", "off"])
    assert phase_depths(off) is None
    assert phase_depths(off, "adaptive") == PhaseDepths(None, None, None, adaptive=True)


def test_the_old_switching_flag_is_refused_naming_the_new_one() -> None:
    done = _phasespec_command("--phases.switching", "false")
    assert done.returncode == 1 and "--phases.policy" in done.stderr and "Traceback" not in done.stderr


def test_emulation_is_off_by_default_and_a_bad_spec_is_a_settings_error() -> None:
    from engine.args import SettingsError, hook_options

    assert "emulate" not in hook_options(Settings())
    on = Settings(_cli_parse_args=["--engine.emulate_step_ms", "moe-offload", "--engine.emulate_scale", "2"])
    assert hook_options(on)["emulate"] == {"spec": "moe-offload", "scale": 2.0}
    with pytest.raises(SettingsError, match="A\\+B\\*tokens"):
        hook_options(Settings(_cli_parse_args=["--engine.emulate_step_ms", "slow"]))


def test_the_command_refuses_a_bad_setting_with_a_message_not_a_traceback() -> None:
    done = _phasespec_command("--server.log_level", "loud")
    assert done.returncode == 1
    assert "phasespec: invalid settings" in done.stderr and "unknown log level 'loud'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_in_use_is_refused_before_the_engine_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _phasespec_command("--server.port", str(port))
    assert done.returncode == 1
    assert f"phasespec: cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "Traceback" not in done.stderr and "vllm" not in done.stderr.lower()


@pytest.mark.parametrize(
    "flags",
    [
        ["--uds", "/tmp/phasespec.sock"],
        ["--root-path", "/llm"],
        ["--uvicorn-log-level", "debug"],
        ["--enable-ssl-refresh"],
    ],
)
def test_vllm_http_server_flags_phasespec_cannot_honour_are_refused(flags: list[str]) -> None:
    from engine.args import SettingsError, build_vllm_namespace

    with pytest.raises(SettingsError, match=flags[0]):
        build_vllm_namespace(Settings.from_command_line(flags))


def test_vllm_tls_and_h11_flags_reach_uvicorn_as_vllm_serve_passes_them() -> None:
    """What ``vllm serve`` hands uvicorn; tests/test_tls.py serves https with them end to end."""
    from engine.args import build_vllm_namespace, uvicorn_options

    flags = ["--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--ssl-ca-certs", "ca.pem", "--ssl-cert-reqs", "2",
             "--h11-max-header-count", "64", "--disable-uvicorn-access-log"]  # fmt: skip
    kwargs, limits = uvicorn_options(build_vllm_namespace(Settings.from_command_line(flags)))
    assert kwargs == {
        "ssl_keyfile": "k.pem", "ssl_certfile": "c.pem", "ssl_ca_certs": "ca.pem", "ssl_cert_reqs": 2,
        "access_log": False,
    }  # fmt: skip
    assert limits["h11_max_header_count"] == 64 and limits["h11_max_incomplete_event_size"] > 0
    plain, _ = uvicorn_options(build_vllm_namespace(Settings.from_command_line([])))
    assert plain == {"ssl_cert_reqs": 0, "access_log": True}  # vLLM's defaults: no TLS, access log on


@pytest.mark.parametrize(("flag", "setting"), [("--host", "--server.host"), ("--port", "--server.port")])
def test_vllm_host_and_port_flags_are_refused_naming_the_phasespec_setting(flag: str, setting: str) -> None:
    from engine.args import SettingsError, build_vllm_namespace

    with pytest.raises(SettingsError, match=setting):
        build_vllm_namespace(Settings.from_command_line(["--max-model-len", "1024", flag, "8070"]))


def test_vllm_help_lists_the_engine_flags() -> None:
    done = _phasespec_command("--vllm-help")
    assert done.returncode == 0 and "--speculative-config" in done.stdout and "--max-model-len" in done.stdout


def test_engine_flags_still_pass() -> None:
    from engine.args import build_vllm_namespace

    args = build_vllm_namespace(Settings.from_command_line(["--max-model-len", "1024"]))
    assert args.max_model_len == 1024


def test_plain_vllm_in_the_benchmarks_runs_the_engine_phasespec_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """load/bench_overhead.py starts plain vLLM with the flags phasespec builds from the same
    settings: the embedded model and its drafter, then PHASESPEC_VLLM_ARGS (the GPU flags)."""
    from engine.args import build_vllm_namespace, vllm_parser
    from load.bench_overhead import servers

    monkeypatch.setenv("PHASESPEC_VLLM_ARGS", '["--max-model-len", "1024", "--dtype", "bfloat16"]')
    flags, is_vllm = servers()["vllm"]
    assert is_vllm and flags[0] == "--model" and flags[-4:] == ["--max-model-len", "1024", "--dtype", "bfloat16"]
    plain = vllm_parser().parse_args(flags)
    ours = build_vllm_namespace(Settings())
    for dest in ("model", "speculative_config", "dtype", "max_model_len", "enforce_eager", "reasoning_parser"):
        assert getattr(plain, dest) == getattr(ours, dest), dest


def test_request_defaults_hold_eos_through_the_budget_and_a_request_s_own_values_win() -> None:
    """The embedded model's defaults (engine/llm.py apply_defaults), on vLLM's own SamplingParams."""
    from vllm import SamplingParams

    from engine.llm import RequestDefaults, apply_defaults

    defaults = RequestDefaults(thinking_token_budget=48, hold_eos_while_thinking=True)
    plain = SamplingParams(max_tokens=100)
    apply_defaults(plain, defaults, reasoning_end_len=9)
    assert plain.thinking_token_budget == 48 and plain.min_tokens == 48 + 9 + 1
    own_budget = SamplingParams(max_tokens=100, thinking_token_budget=10)
    apply_defaults(own_budget, defaults, reasoning_end_len=9)
    assert own_budget.thinking_token_budget == 10 and own_budget.min_tokens == 10 + 9 + 1
    own_min = SamplingParams(max_tokens=100, min_tokens=3)
    apply_defaults(own_min, defaults, reasoning_end_len=9)
    assert own_min.min_tokens == 3
    short = SamplingParams(max_tokens=20)
    apply_defaults(short, defaults, reasoning_end_len=9)
    assert short.min_tokens == 20, "never more than max_tokens"
    off = SamplingParams(max_tokens=100)
    apply_defaults(off, RequestDefaults(thinking_token_budget=48, hold_eos_while_thinking=False), reasoning_end_len=9)
    assert off.min_tokens == 0


def test_a_default_thinking_budget_of_minus_one_sets_none_even_on_the_embedded_model() -> None:
    """What a like-for-like benchmark against plain vLLM (which sets no budget) needs."""
    from engine.args import EMBEDDED_THINKING_BUDGET, request_defaults

    assert request_defaults(Settings()).thinking_token_budget == EMBEDDED_THINKING_BUDGET
    unlimited = Settings(engine={"default_thinking_budget": -1})
    assert request_defaults(unlimited).thinking_token_budget is None
    with pytest.raises(ValueError, match="-1 sets none"):
        Settings(engine={"default_thinking_budget": 0})


def _phasespec_command(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``phasespec`` command as users run it (``proxy/cli.py``), in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True, timeout=120)


def test_the_step_max_patience_flag_reaches_the_controller_and_one_below_1_is_refused() -> None:
    from pydantic import ValidationError

    from engine.args import hook_options
    from engine.controller import ControllerSettings, DepthController

    adaptive = hook_options(Settings(_cli_parse_args=["--adaptive.step_max_patience", "3"]))["adaptive"]
    controller = DepthController(3, ControllerSettings(**{**adaptive, "step_depth": True}))  # as the hook builds it
    assert controller.step_chooser.max_patience == 3.0
    assert Settings().adaptive.step_max_patience == ControllerSettings().step_max_patience
    with pytest.raises(ValidationError, match="step_max_patience"):
        Settings(_cli_parse_args=["--adaptive.step_max_patience", "0.5"])
