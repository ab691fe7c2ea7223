"""A verifiers 0.4 taskset with a tool: the built-in task's word problems and an MCP toolset with ``calc``
(``TOOL_PREFIX = None``: the model sees the bare name, which the built-in tool models know). The reward is the
final answer's ``#### N``."""

import re

import verifiers.v1 as vf

from areal_trainer.data import arith


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    def calc(self, expression: str) -> str:
        """Evaluate an arithmetic expression of integers with + and -."""
        if not re.fullmatch(r"[\d\s+\-]+", expression):
            raise ValueError(f"not an expression of integers with + and -: {expression!r}")
        return str(eval(expression))  # noqa: S307 - digits, spaces, + and - only (checked above)


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcData(vf.TaskData):
    answer: str


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = re.findall(r"####\s*(-?\d+)", trace.last_reply)
        return float(bool(found) and found[-1] == self.data.answer)

    @vf.metric
    async def tool_results(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    num_tasks: int = 40
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self):
        for row in arith.generate("train", self.config.num_tasks):
            yield CalcTask(CalcData(prompt=row["question"], answer=row["answer"].split("####")[-1].strip()),
                           self.config.task)


__all__ = ["CalcTaskset"]
