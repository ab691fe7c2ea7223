"""The built-in task: arithmetic word problems in GSM8K's format, generated offline.

Each row has ``question`` and ``answer`` (a one-line working, then ``#### <number>``), exactly the
fields of ``openai/gsm8k``, and the reward checks the number after ``####``. Problems are a
deterministic function of ``(split, seed)``; a row's split is decided by a hash of its text, so the
test split's questions never occur in the train split.

Rows also carry a ``demonstration``: the answer of an imperfect teacher, used by the supervised
warm start. The teacher solves addition problems correctly but, on subtraction problems, adds the
two numbers instead in ``TEACHER_SUBTRACTION_ERROR`` of the cases (a common misreading of word
problems). A model that imitates it writes sums for most subtraction problems; reinforcement
learning with the exact-answer reward has to discover that these problems need a subtraction.
"""

from __future__ import annotations

import hashlib
import random

NAMES = ("Tom", "Anna", "Ben", "Lucy", "Sam", "Mia", "Leo", "Emma", "Jack", "Zoe", "Omar", "Nina")
ITEMS = ("apples", "books", "coins", "pens", "cards", "stickers", "marbles", "cookies", "shells", "stamps")
MAX_OPERAND = 20
MAX_NUMBER = 2 * MAX_OPERAND
TEACHER_SUBTRACTION_ERROR = 0.6

# (template, operation); {n}=name, {m}=second name, {i}=item, {a},{b}=operands.
TEMPLATES = (
    ("{n} has {a} {i}. {n} buys {b} more. How many {i} does {n} have now?", "+"),
    ("{n} had {a} {i} and found {b} more. How many {i} does {n} have?", "+"),
    ("There are {a} {i} in a box and {b} {i} on the table. How many {i} are there in total?", "+"),
    ("{n} has {a} {i} and {m} has {b} {i}. How many {i} do they have together?", "+"),
    ("{n} has {a} {i}. {n} gives {b} {i} to {m}. How many {i} does {n} have left?", "-"),
    ("{n} had {a} {i} and lost {b} of them. How many {i} are left?", "-"),
    ("There were {a} {i} on the shelf. {m} took {b}. How many {i} are on the shelf now?", "-"),
    ("{n} has {a} {i}. {m} has {b} fewer {i} than {n}. How many {i} does {m} have?", "-"),
)


def make_problem(rng: random.Random) -> dict:
    template, op = rng.choice(TEMPLATES)
    a, b = rng.randint(1, MAX_OPERAND), rng.randint(1, MAX_OPERAND)
    if op == "-" and b > a:
        a, b = b, a
    n, m = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    result = a + b if op == "+" else a - b
    question = template.format(n=n, m=m, i=item, a=a, b=b)
    answer = f"{a} {op} {b} = {result}\n#### {result}"
    demonstration = answer
    if op == "-" and rng.random() < TEACHER_SUBTRACTION_ERROR:
        demonstration = f"{a} + {b} = {a + b}\n#### {a + b}"
    return {"question": question, "answer": answer, "demonstration": demonstration}


def _split_of(question: str) -> str:
    h = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16)
    return "test" if h % 10 == 0 else "train"


def generate(split: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct-text problems of ``split`` ('train' or 'test'), deterministic in ``seed``."""
    if split not in ("train", "test"):
        raise ValueError(f"builtin:arith has splits 'train' and 'test', not {split!r}")
    rng = random.Random(f"arith-{split}-{seed}")
    rows, seen = [], set()
    # The space holds ~80k distinct texts per split; give up well before a pathological request spins.
    for _ in range(50 * n + 1000):
        row = make_problem(rng)
        q = row["question"]
        if q in seen or _split_of(q) != split:
            continue
        seen.add(q)
        rows.append(row)
        if len(rows) == n:
            return rows
    raise ValueError(f"builtin:arith cannot make {n} distinct {split} problems; ask for fewer (max_rows).")


def corpus() -> list[str]:
    """Text covering every word the generator can produce (to build the built-in tokenizer)."""
    lines = [t.format(n=n, m=n, i=i, a=1, b=2) for t, _ in TEMPLATES for n in NAMES for i in ITEMS]
    numbers = " ".join(str(k) for k in range(-MAX_NUMBER, 10 * MAX_NUMBER + 1))
    lines += [numbers, numbers.replace(" ", "\n"), "1 + 2 = 3\n#### 3", "1 - 2 = -1\n#### -1"]
    return lines


CALC_TOOL = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression of integers with + - * /.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
"""The calculator tool of the tool demonstrations (the schema an agent's ``calc(expression: str)`` has)."""


def tool_demonstration(demonstration: str) -> list[dict]:
    """The teacher's ``demonstration`` as a calculator conversation (the turns after the prompt): a hermes
    call ``calc`` on the teacher's expression (so the same imperfect teacher), the tool's value, and
    ``#### <value>``. Made from the rows, so they and their order are those of :func:`generate`."""
    expression, value = demonstration.split("\n", 1)[0].split(" = ")
    call = {"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": {"expression": expression}}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "name": "calc", "content": value},
            {"role": "assistant", "content": f"#### {value}"}]
