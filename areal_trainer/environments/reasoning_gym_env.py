"""reasoning-gym tasks (``environment.type=reasoning_gym``): procedurally generated problems scored by the
task's own ``score_answer``.

``reasoning_gym.create_dataset(id, size=, seed=, **kwargs)`` makes the training problems (``environment.seed``,
``environment.size``, default 1000) and, with another seed, the held-out ones (``environment.eval_seed``,
``environment.eval_size``). Each entry ``{question, answer, metadata}`` becomes a single-turn row: the question
as the user message, after the system prompt (reasoning-gym's own default instruction, which asks for the
answer in ``<answer>`` tags; ``environment.system_prompt`` replaces it). An answer is scored by
``dataset.score_answer(extracted, entry)``, a number in [0, 1]: the text of the last
``<environment.answer_tag>`` tag as reasoning-gym's evaluations extract it (None without one, which scores 0),
the whole answer, stripped, with ``environment.answer_tag=null``, or the last match of
``environment.answer_pattern`` when it is set (its first group if it has one; None without a match). A score
of 1 is a correct answer (``all_or_nothing``); some tasks give partial credit below it.
"""

from __future__ import annotations

import asyncio
import inspect
import re

from ..data.files import Row
from ..errors import suggest
from .base import KEY, EnvironmentFailure, Score, Settings, describe, prompt_messages, reward_value

DEFAULT_SIZE = 1000


class ReasoningGymEnvironment:
    multi_turn = False
    verdict = "all_or_nothing"

    def __init__(self, settings: Settings):
        import reasoning_gym
        from reasoning_gym.factory import DATASETS

        self.settings, self.label = settings, f"reasoning_gym:{settings.id}"
        if settings.id not in DATASETS:
            hint = suggest(settings.id, DATASETS)
            raise EnvironmentFailure("id", f"reasoning-gym has no task {settings.id!r}.{hint} Its {len(DATASETS)} "
                                           f"tasks: {', '.join(sorted(DATASETS))}.")
        self._create = reasoning_gym.create_dataset
        self._datasets: dict[str, object] = {}
        self._entries: dict[str, dict] = {}
        self._dataset("train")  # a bad kwarg of the task's config is reported before any model loads

    def _dataset(self, split: str):
        if split not in self._datasets:
            s = self.settings
            size = (s.size or DEFAULT_SIZE) if split == "train" else s.eval_size
            try:
                self._datasets[split] = self._create(s.id, size=size, seed=s.seed_of(split, DEFAULT_SIZE),
                                                     **dict(s.kwargs))
            except (TypeError, ValueError, AssertionError) as e:
                raise EnvironmentFailure("id", f"reasoning_gym.create_dataset({s.id!r}, **environment.kwargs) "
                                               f"raised {describe(e)}") from e
        return self._datasets[split]

    def system_prompt(self) -> str | None:
        s = self.settings
        if s.system_prompt is not None:
            return s.system_prompt or None
        if s.answer_tag != "answer" or s.answer_pattern is not None:
            return None
        from reasoning_gym.utils import SYSTEM_PROMPTS

        return SYSTEM_PROMPTS["default"]

    def rows(self, split: str) -> list[Row]:
        ds = self._dataset(split)
        system = self.system_prompt()
        out = []
        for i, entry in enumerate(ds):
            key = f"{split}/{i}"
            self._entries[key] = entry
            columns = {"prompt": prompt_messages(system, str(entry["question"])), KEY: key}
            if isinstance(entry.get("answer"), str) and entry["answer"].strip():
                columns["answer"] = entry["answer"]
            out.append(Row(columns, f"problem {i} of {self.label} ({split}, seed {self.settings.seed_of(split, 0)})"))
        return out

    def extract(self, completion: str) -> str | None:
        s = self.settings
        if s.answer_pattern is not None:
            found = list(re.finditer(s.answer_pattern, completion))
            if not found:
                return None
            last = found[-1]
            return last.group(1) if last.re.groups else last.group(0)
        tag = s.answer_tag
        if tag is None:
            return completion.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(completion, tag_name=tag)

    async def score(self, fields: dict, completion: str) -> Score:
        entry = self._entries.get(fields.get(KEY))
        if entry is None:
            raise EnvironmentFailure("score", f"no problem {fields.get(KEY)!r} (a row this environment did not make)")
        split = str(fields[KEY]).split("/")[0]
        ds = self._dataset(split)
        try:  # in a thread: a scoring that hangs is cut by reward.timeout, and the run goes on
            value = await asyncio.to_thread(ds.score_answer, self.extract(completion), entry)
            if inspect.isawaitable(value):
                value = await value
        except Exception as e:  # noqa: BLE001 - the environment's scoring failed: counted, never the run's end
            raise EnvironmentFailure("score", f"score_answer raised {describe(e)}") from e
        reward = reward_value(value, f"{type(ds).__name__}.score_answer")
        return Score(reward, {"score_answer": reward})
