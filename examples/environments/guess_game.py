"""A Gymnasium text game for the built-in models: a word problem of the built-in task; the answer ``#### N``
ends the game with reward 1 when ``N`` is right, else the game says whether the number is more or fewer and the
player answers again (``environment.max_turns`` answers in all). Registered as ``ArithGame-v0`` when imported
(``environment.id=examples.environments.guess_game:ArithGame-v0``).

``reset(seed=s)`` picks problem ``s`` of the built-in task's training problems (``problems`` of them, all
distinct: training seeds and the held-out ones, from ``seed + size`` on, never share a problem); its ``info``
gives the built-in teacher's ``demonstration`` (right about half of the time), which the warm start of the
built-in model imitates. README.md in this folder has the measured run.
"""

import functools
import re
import string

import gymnasium as gym
from gymnasium import spaces

from areal_trainer.data import arith

TEXT = spaces.Text(max_length=1000, charset=string.printable)


@functools.cache
def _problems(n: int) -> tuple[dict, ...]:
    return tuple(arith.generate("train", n))


class ArithGame(gym.Env):
    def __init__(self, problems: int = 2500):
        self.problems = _problems(problems)
        self.observation_space, self.action_space = TEXT, TEXT

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        row = self.problems[(seed or 0) % len(self.problems)]
        self.answer = int(row["answer"].split("####")[-1])
        return row["question"], {"demonstration": row["demonstration"]}

    def step(self, action: str):
        found = re.findall(r"####\s*(-?\d+)", action)
        if found and int(found[-1]) == self.answer:
            return "Right.", 1.0, True, False, {}
        if not found:
            return "How many?", 0.0, False, False, {}
        return ("There are more." if int(found[-1]) < self.answer else "There are fewer."), 0.0, False, False, {}


gym.register("ArithGame-v0", entry_point=ArithGame)
