"""Copy-style prompts: they give ngram drafting something to match."""

from __future__ import annotations

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


def copy_prompt(i: int) -> str:
    sentence = SENTENCES[i % len(SENTENCES)]
    return f"Repeat this sentence three times, then explain it: {sentence}. {sentence}."
