"""A single-turn verifiers 0.4 taskset: the built-in task's word problems, scored by two weighted reward
functions (the final number, and a short answer) and a metric."""

import re

import verifiers.v1 as vf

from areal_trainer.data import arith


class ArithData(vf.TaskData):
    answer: str


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 40
    split: str = "train"
    fail_on: int = -1
    """A task index whose scoring raises (for the failure tests); -1: none."""
    nan_on: int = -1
    """A task index whose reward is NaN; -1: none."""


def last_number(text: str) -> str | None:
    found = re.findall(r"-?\d+", text or "")
    return found[-1] if found else None


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(last_number(trace.last_reply) == self.data.answer)

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()) <= 3)

    @vf.metric
    async def words(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()))


class FlakyTask(ArithTask):
    fail = False
    nan = False

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        if self.fail:
            raise RuntimeError("the grader crashed")
        return float("nan") if self.nan else await super().correct(trace)


class ArithTaskset(vf.Taskset[FlakyTask, ArithConfig]):
    def load(self):
        rows = arith.generate(self.config.split, self.config.num_tasks)
        for i, row in enumerate(rows):
            task = FlakyTask(ArithData(prompt=row["question"], system_prompt="Answer with the number.",
                                       answer=row["answer"].split("####")[-1].strip()), self.config.task)
            task.fail, task.nan = i == self.config.fail_on, i == self.config.nan_on
            yield task


__all__ = ["ArithTaskset"]
