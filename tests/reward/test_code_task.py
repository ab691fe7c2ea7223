"""The code example task: every generated problem's reference solution passes its tests in the
sandbox and its near miss does not; rows carry prompt, tests and task type only; generation is
deterministic."""

import json

from areal_trainer.reward.code import unit_tests
from examples.code_task.problems import SHAPES, generate, write_jsonl

from ..isolation import needs_isolation


def fenced(code: str) -> str:
    return f"```python\n{code}```"


@needs_isolation
def test_reference_solutions_pass_and_near_misses_fail():
    problems = generate(2 * len(SHAPES), seed=3)
    for p in problems:
        assert 3 <= len(p.tests) <= 5, p
        assert unit_tests(p.prompt, fenced(p.solution), "", tests=p.tests) == 1.0, p
        assert unit_tests(p.prompt, fenced(p.wrong), "", tests=p.tests) < 1.0, p


def test_rows_and_determinism(tmp_path):
    path = tmp_path / "code.jsonl"
    problems = write_jsonl(str(path), 9, seed=0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 9
    for row, p in zip(rows, problems):
        assert set(row) == {"prompt", "tests", "task_type"} and row["task_type"] == "code"
        assert row["prompt"] == [{"role": "user", "content": p.prompt}] and row["tests"] == p.tests
        assert "Write a Python function `" in p.prompt
    names = {p.tests[0].split()[1].split("(")[0] for p in problems[:len(SHAPES)]}
    assert len(names) == len(SHAPES)  # every shape once in the first len(SHAPES) problems
    again = tmp_path / "again.jsonl"
    write_jsonl(str(again), 9, seed=0)
    assert again.read_text() == path.read_text()
    assert generate(9, seed=1) != problems
