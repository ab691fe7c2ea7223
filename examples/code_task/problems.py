"""Small Python-function problems with unit tests, generated offline and deterministically.

Each problem asks for one function (``f(x)`` returning ``3*x + 2``, the distance of ``x`` to a number,
the larger of two numbers, a repeated string, a clamped value, a list sum or count) and carries 3-5
``assert`` tests whose expected values are computed here in Python, not by the reference solution,
so ``tests/reward/test_code_task.py`` can check the two against each other. Every problem also keeps
a reference solution and a near miss (an off-by-one or a forgotten case) that must fail at least one
test; neither goes into the dataset.

Rows are TRL-style conversational prompt-only rows with an extra ``tests`` column for the reward
:func:`areal_trainer.reward.code.unit_tests`::

    {"prompt": [{"role": "user", "content": "Write a Python function `f(x)` ..."}],
     "tests": ["assert f(1) == 5", ...], "task_type": "code"}

Problems are a deterministic function of ``(n, seed)``; the shapes take turns, so every shape occurs
once ``n >= len(SHAPES)``. The parameter space is small, so different seeds can repeat a problem.

    python -m examples.code_task.problems data/code_train.jsonl --n 2000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

INSTRUCTION = ("Write a Python function `{signature}` that {description}. Answer with the function in a ```python "
               "code block.")
WORDS = ("ab", "cat", "xy", "hello", "z", "go", "red", "moon")


@dataclass(frozen=True)
class Problem:
    prompt: str
    """The user message."""
    tests: list[str]
    """3-5 assert statements."""
    solution: str
    """A reference solution (kept out of the dataset)."""
    wrong: str
    """A plausible wrong solution that fails at least one test (kept out of the dataset)."""


def _problem(rng: random.Random, signature: str, description: str, body: str, wrong_body: str,
             cases: list[tuple], expected: Callable) -> Problem:
    """Assemble a problem; ``cases`` are argument tuples, of which 3-5 become tests."""
    name = signature.split("(", 1)[0]
    chosen = cases[:rng.randint(3, min(5, len(cases)))]
    tests = [f"assert {name}({', '.join(map(repr, args))}) == {expected(*args)!r}" for args in chosen]
    define = f"def {signature}:\n    return "
    return Problem(INSTRUCTION.format(signature=signature, description=description), tests,
                   define + body + "\n", define + wrong_body + "\n")


def _ints(rng: random.Random, k: int, lo: int = -10, hi: int = 10) -> list[int]:
    return rng.sample(range(lo, hi + 1), k)


def linear(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 9), rng.choice([i for i in range(-9, 10) if i])
    formula = f"{a}*x {'+' if b > 0 else '-'} {abs(b)}"
    cases = [(0,)] + [(x,) for x in _ints(rng, 4) if x]
    return _problem(rng, "f(x)", f"returns {formula}", formula.replace("*", " * "), f"{a} * x + {b + 1}",
                    cases, lambda x: a * x + b)


def distance(rng: random.Random) -> Problem:
    a = rng.randint(-5, 5)
    # The first cases lie below and above a: a forgotten abs() fails one of them.
    cases = [(a - rng.randint(1, 5),), (a + rng.randint(1, 5),)] + [(x,) for x in _ints(rng, 3)]
    diff = f"x - {a}" if a >= 0 else f"x + {-a}"
    return _problem(rng, "dist(x)", f"returns the distance between x and {a}, that is abs({diff})",
                    f"abs({diff})", diff, cases, lambda x: abs(x - a))


def larger(rng: random.Random) -> Problem:
    pairs = [tuple(_ints(rng, 2)) for _ in range(5)]
    x, y = pairs[0]
    pairs[0] = (min(x, y), max(x, y))  # the second one larger: returning the first argument fails
    return _problem(rng, "larger(a, b)", "returns the larger of the two numbers a and b", "max(a, b)", "a",
                    pairs, max)


def repeat(rng: random.Random) -> Problem:
    k = rng.randint(2, 4)
    cases = [(w,) for w in rng.sample(WORDS, 5)]
    return _problem(rng, "repeat(s)", f"returns the string s repeated {k} times", f"s * {k}", f"s * {k - 1}",
                    cases, lambda s: s * k)


def clamp(rng: random.Random) -> Problem:
    lo = rng.randint(-5, 0)
    hi = lo + rng.randint(3, 8)
    cases = [(hi + rng.randint(1, 5),), (lo - rng.randint(1, 5),), (rng.randint(lo, hi),), (lo,), (hi,)]
    return _problem(rng, "clamp(x)", f"returns x limited to the range from {lo} to {hi} (inclusive)",
                    f"min(max(x, {lo}), {hi})", f"max(x, {lo})", cases, lambda x: min(max(x, lo), hi))


def total(rng: random.Random) -> Problem:
    c = rng.randint(1, 5)
    lists = [_ints(rng, rng.randint(2, 5)) for _ in range(4)] + [[]]
    return _problem(rng, "total(xs)", f"returns the sum of the numbers in the list xs plus {c}",
                    f"sum(xs) + {c}", "sum(xs)", [(xs,) for xs in lists], lambda xs: sum(xs) + c)


def count_above(rng: random.Random) -> Problem:
    t = rng.randint(-3, 3)
    lists = [[t, t + 1, t - 1]] + [_ints(rng, rng.randint(2, 6)) for _ in range(4)]
    return _problem(rng, "count_above(xs)", f"returns how many numbers in the list xs are greater than {t}",
                    f"sum(1 for x in xs if x > {t})", f"sum(1 for x in xs if x >= {t})", [(xs,) for xs in lists],
                    lambda xs: sum(1 for x in xs if x > t))


SHAPES: tuple[Callable[[random.Random], Problem], ...] = (linear, distance, larger, repeat, clamp, total,
                                                          count_above)


def generate(n: int, seed: int) -> list[Problem]:
    """``n`` problems, the shapes taking turns; the same ``(n, seed)`` always gives the same problems."""
    rng = random.Random(seed)
    return [SHAPES[i % len(SHAPES)](rng) for i in range(n)]


def to_row(problem: Problem) -> dict:
    """The dataset row of a problem: prompt, tests and task type, not the solutions."""
    return {"prompt": [{"role": "user", "content": problem.prompt}], "tests": list(problem.tests),
            "task_type": "code"}


def write_jsonl(path: str, n: int, seed: int) -> list[Problem]:
    """Write ``n`` problems' rows to ``path`` (one JSON object per line); returns the problems."""
    problems = generate(n, seed)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(to_row(p)) + "\n")
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write Python-function problems with unit tests as JSONL.")
    parser.add_argument("path")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_jsonl(args.path, args.n, args.seed)


if __name__ == "__main__":
    main()
