"""Plain vLLM, no phasespec: does a named tool call's greedy text depend on K?

    PHASESPEC_ENGINE__DRAFTER=self-draft python3 -m load.structured_probe --k 1,3 --out DIR

On vLLM 0.23.0 (H200, self-draft, async scheduling) phasespec's named-tool-call test gave
different arguments at its default depths and at K (docs/gpu.md, sixth session). This starts
vLLM's own server on the same engine flags (``engine.args.engine_argv``) once per K, sends the
test's request (``load/workload.py``: a named ``tool_choice``, vLLM's structured output, with
the thinking budget phasespec gives the embedded model) and reports whether the calls match:
if they differ here too, the dependence on K is vLLM's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from load.server import ServerProcess

if TYPE_CHECKING:
    from engine.llm import RequestDefaults

SPEC_FLAG = "--speculative-config"


def flags_with_k(argv: list[str], k: int) -> list[str]:
    """The engine flags with the speculative config's number of draft tokens set to ``k``."""
    at = argv.index(SPEC_FLAG) + 1
    spec = {**json.loads(argv[at]), "num_speculative_tokens": k}
    return [*argv[:at], json.dumps(spec), *argv[at + 1 :]]


def request_body(model: str, defaults: RequestDefaults, reasoning_end_len: int) -> dict[str, Any]:
    """The test's request as phasespec sends it on: its request defaults applied by its own
    ``apply_defaults`` (for the embedded model a thinking budget and the EOS hold through it; the
    model never ends reasoning itself, so without the hold it stops at once)."""
    from vllm import SamplingParams

    from engine.llm import apply_defaults
    from load.workload import NAMED_CHOICE, PROMPT, WEATHER_TOOL

    params = SamplingParams(max_tokens=150, temperature=0)
    apply_defaults(params, defaults, reasoning_end_len)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": params.max_tokens,
        "temperature": 0,
        "tools": [WEATHER_TOOL],
        "tool_choice": NAMED_CHOICE,
        "min_tokens": params.min_tokens,
    }
    if params.thinking_token_budget is not None:
        body["thinking_token_budget"] = params.thinking_token_budget
    return body


def generated(message: dict[str, Any]) -> dict[str, Any]:
    """What the model wrote: reasoning, content and the calls' functions (their ids are random)."""
    calls = [call["function"] for call in message.get("tool_calls") or []]
    return {"reasoning": message.get("reasoning"), "content": message.get("content"), "calls": calls}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", default="1,3", help="draft tokens per step, one server each")
    parser.add_argument("--out", type=Path, default=Path("load/results/structured-probe"))
    cfg = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from config import Settings
    from engine.args import EMBEDDED_REASONING_END, apply_environment, engine_argv, request_defaults
    from engine.default_model import MODEL_NAME, ensure_default_model

    settings = Settings()
    apply_environment(settings)
    base = engine_argv(settings)
    reasoning_end = AutoTokenizer.from_pretrained(ensure_default_model(settings.engine.cache_dir)).encode(
        EMBEDDED_REASONING_END, add_special_tokens=False
    )
    body = request_body(MODEL_NAME, request_defaults(settings), len(reasoning_end))
    cfg.out.mkdir(parents=True, exist_ok=True)
    calls: dict[int, Any] = {}
    for k in (int(k) for k in cfg.k.split(",")):
        server = ServerProcess(*flags_with_k(base, k), log_path=cfg.out / f"vllm-k{k}.log", vllm_server=True)
        server.start()
        try:
            reply = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=300)
            reply.raise_for_status()
            calls[k] = reply.json()["choices"][0]["message"]
        finally:
            server.stop()
        print(f"[probe] K={k}: {json.dumps(calls[k].get('tool_calls'))}", flush=True)
    same = len({json.dumps(generated(message), sort_keys=True) for message in calls.values()}) == 1
    (cfg.out / "calls.json").write_text(json.dumps({"same_at_every_k": same, "by_k": calls}, indent=2))
    print(f"[probe] plain vLLM's named tool call is {'the same' if same else 'DIFFERENT'} at K = {cfg.k}")


if __name__ == "__main__":
    main()
