"""The benchmark and test workloads: copy-style and free reasoning prompts.

Asking the model to repeat and then explain a sentence gives ngram drafting
something to match, as real reasoning models' answers restate their
reasoning. The embedded model reasons for its thinking budget, then answers.
The mixed workload alternates those with open questions that give a drafter
nothing to copy (``free_prompt``).
"""

from __future__ import annotations

from typing import Any

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "all that glitters is not gold and all who wander are not lost",
    "to be or not to be that is the question",
    "the rain in spain stays mainly in the plain",
    "an apple a day keeps the doctor away",
    "early to bed and early to rise makes a man healthy wealthy and wise",
    "actions speak louder than words but words still matter",
    "the early bird catches the worm but the second mouse gets the cheese",
    "knowledge is power and power is responsibility",
    "practice makes perfect when practice is deliberate",
    "where there is a will there is a way",
]
INSTRUCTIONS = [
    "Repeat this sentence three times, then explain it: {s}. {s}.",
    "Think about this sentence, quote it twice and say what it means: {s}. {s}.",
]


def copy_prompt(i: int) -> str:
    """Prompt i of the workload; distinct for i < 24."""
    sentence = SENTENCES[i % len(SENTENCES)]
    template = INSTRUCTIONS[(i // len(SENTENCES)) % len(INSTRUCTIONS)]
    return template.format(s=sentence)


TOPICS = [
    "why the sky changes colour at sunset",
    "how a city could cut its traffic",
    "what makes a good teacher",
    "whether robots should pay taxes",
    "how bees decide where to build a hive",
    "what life on a ship a thousand years ago was like",
]
FREE = [
    "Think freely about {t} and give your own view in a few words.",
    "Invent an unusual story about {t}, then sum it up.",
]
WORKLOADS = ("copy", "mixed")


def free_prompt(i: int) -> str:
    """Open question i: nothing in the prompt to copy; distinct for i < 12."""
    return FREE[(i // len(TOPICS)) % len(FREE)].format(t=TOPICS[i % len(TOPICS)])


def workload_prompt(workload: str, i: int) -> tuple[str, str]:
    """(kind, text) of request i: the copy workload, or copy and free requests alternating."""
    if workload == "mixed" and i % 2:
        return "free", free_prompt(i // 2)
    return "copy", copy_prompt(i // 2 if workload == "mixed" else i)


# The API tests' request (and load/structured_probe.py's): a short copy task, and a strict tool
# named in tool_choice (vLLM's structured output).
PROMPT = "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        # vLLM pins argument schemas only for strict tools (--tool-strict-level auto).
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
NAMED_CHOICE: dict[str, Any] = {"type": "function", "function": {"name": "get_weather"}}


def chat_prompt(engine: Any, text: str) -> dict[str, Any]:
    """``text`` as a user turn in the engine's chat template, as prompt token ids."""
    tokenizer = engine.get_tokenizer()
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return {"prompt_token_ids": tokenizer.encode(rendered, add_special_tokens=False)}
