"""OpenAI-strict body checks (proxy/strict.py): table-driven, pure."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.strict import CHAT, COMPLETIONS, Invalid, check, parse

MSG = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, **fields}


@pytest.mark.parametrize(
    ("path", "data", "param"),
    [
        (CHAT, chat(stream="yes"), "stream"),
        (CHAT, chat(stream=1), "stream"),
        (CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role"),
        (CHAT, chat(messages=[{"role": "user", "content": "hi", "name": 3}]), "messages[0].name"),
        (CHAT, chat(max_tokens="8"), "max_tokens"),
        (CHAT, chat(max_tokens=8.5), "max_tokens"),
        (CHAT, chat(max_tokens=True), "max_tokens"),
        (CHAT, chat(temperature="0.5"), "temperature"),
        (CHAT, chat(temperature=2.5), "temperature"),
        (CHAT, chat(top_p=-0.1), "top_p"),
        (CHAT, chat(presence_penalty=3), "presence_penalty"),
        (CHAT, chat(n=129), "n"),
        (CHAT, chat(logprobs="true"), "logprobs"),
        (CHAT, chat(top_logprobs=21), "top_logprobs"),
        (CHAT, chat(stop=["a", 1]), "stop"),
        (CHAT, chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options"),
        (CHAT, chat(logit_bias=[1, 2]), "logit_bias"),
        (CHAT, chat(user=5), "user"),
        (CHAT, chat(model=["m"]), "model"),
        (CHAT, chat(parallel_tool_calls="no"), "parallel_tool_calls"),
        (CHAT, [MSG], None),
        (COMPLETIONS, {"model": "m", "prompt": [1, "a"]}, "prompt"),
        (COMPLETIONS, {"model": "m", "prompt": "hi", "echo": "true"}, "echo"),
        (COMPLETIONS, {"model": "m", "prompt": "hi", "logprobs": 6}, "logprobs"),
        (COMPLETIONS, {"model": "m", "prompt": "hi", "logprobs": True}, "logprobs"),
    ],
)
def test_what_openai_rejects_is_a_400_naming_the_parameter(path: str, data: Any, param: str | None) -> None:
    with pytest.raises(Invalid) as error:
        check(path, data)
    assert error.value.param == param


@pytest.mark.parametrize(
    ("path", "data"),
    [
        (CHAT, chat()),
        (CHAT, chat(stream=True, stream_options={"include_usage": True}, max_tokens=8, temperature=0, top_p=1)),
        (CHAT, chat(stream=None, temperature=None, stop="x", seed=-3, n=2, logprobs=True, top_logprobs=5)),
        (CHAT, chat(messages=[{"role": r, "content": "x"} for r in ("system", "developer", "assistant", "tool")])),
        # vLLM's own extras pass untouched
        (CHAT, chat(chat_template_kwargs={"enable_thinking": False}, thinking_token_budget=16, vllm_xargs={"a": 1})),
        (CHAT, chat(top_k=5, min_tokens=2, ignore_eos=True, repetition_penalty=1.1, skip_special_tokens=False)),
        (CHAT, chat(temperature=2, presence_penalty=-2.0)),
        (COMPLETIONS, {"model": "m", "prompt": "hi", "echo": True, "logprobs": 5, "suffix": "s", "best_of": 1}),
        (COMPLETIONS, {"model": "m", "prompt": ["a", "b"]}),
        (COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}),
        (COMPLETIONS, {"model": "m", "prompt": [[1, 2], [3]]}),
    ],
)
def test_well_formed_requests_pass(path: str, data: Any) -> None:
    check(path, data)


@pytest.mark.parametrize(
    ("body", "word"),
    [
        (b"\xff\xfe{}", "UTF-8"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xc3\x28"}]}', "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "deeply"),
        (b'{"model": ', "JSON"),
        (b"", "JSON"),
        (b'{"model": "m", "temperature": NaN}', "NaN is not a JSON value"),
    ],
)
def test_undecodable_bodies_are_400s(body: bytes, word: str) -> None:
    with pytest.raises(Invalid, match=word):
        parse(body)
