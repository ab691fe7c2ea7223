"""A verifiers 0.4 taskset with a tool (``import verifiers.v1 as vf``), for the built-in tool-calling model: the
built-in task's word problems, a ``calc`` MCP tool server, and one reward function, the final ``#### N``.

Run from the repository root (README.md in this folder):

    python -m areal_trainer --config-dir examples/environments --config-name calc_taskset

Each task carries, besides its prompt and answer, a demonstration conversation (a ``calc`` call on the
built-in teacher's expression, the tool's result, ``#### <result>``: the teacher is right about half of the
time), which the warm start of the built-in model imitates; RL then learns the right operation.
"""

import ast
import operator
import re

import verifiers.v1 as vf

from areal_trainer.data import arith

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub}


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("only integers with + and - are allowed")


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # the model sees the bare name calc, which the built-in tool models know

    @vf.tool
    def calc(self, expression: str) -> str:
        """Evaluate an arithmetic expression of integers with + and -."""
        try:
            return str(_value(ast.parse(expression, mode="eval").body))
        except (SyntaxError, ValueError):
            raise ValueError(f"not an expression of integers with + and -: {expression!r}") from None


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcData(vf.TaskData):
    answer: str
    demonstration_messages: list[dict]
    demonstration_tools: list[dict]


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = re.findall(r"####\s*(-?\d+)", trace.last_reply)
        return float(bool(found) and found[-1] == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    split: str = "train"
    """``train`` or ``test``: the built-in task's splits (disjoint problems)."""
    num_tasks: int = 2000
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self):
        for row in arith.generate(self.config.split, self.config.num_tasks):
            yield CalcTask(CalcData(prompt=row["question"], answer=row["answer"].split("####")[-1].strip(),
                                    demonstration_messages=arith.tool_demonstration(row["demonstration"]),
                                    demonstration_tools=[arith.CALC_TOOL]), self.config.task)


__all__ = ["CalcTaskset"]
