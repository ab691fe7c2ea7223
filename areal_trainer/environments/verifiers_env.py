"""verifiers tasksets (``environment.type=verifiers``, written against verifiers 0.4.0, ``import verifiers.v1
as vf``): the taskset gives the tasks, each task its prompt, tools and reward functions.

Loading. ``environment.id`` names the taskset as verifiers resolves it (an installed taskset package or module
exporting its ``vf.Taskset`` subclass in ``__all__``; ``owner/name@version`` hub ids import ``name``); its
config is the taskset's own config class validated from ``environment.kwargs`` (and ``split``). The training
tasks are the first ``environment.size`` of ``environment.split``; the held-out ones the first
``environment.eval_size`` of ``environment.eval_split``, or, without one, the ``eval_size`` tasks after the
training ones.

Episodes. A taskset whose tasks have no tool servers (``Task.toolsets`` and ``Taskset.toolsets`` empty) is
single-turn: each task is a row (its ``system_prompt`` and ``prompt``), and an answer is scored by the task's
own ``score``. One with tools runs as an agent (``verifiers_tools.py``): the chat loop is driven here, in
process, the MCP tool servers run in process too (no network, no ``uv``, no sandbox: verifiers' default
harnesses need those), and the finished conversation is scored by the task. Either way the score is
``vf.Trace.reward``, the weighted sum of the task's ``@vf.reward`` functions (with their weights), and each
reward function's and ``@vf.metric``'s own value is a part (``env/<name>``). Reward functions that need a
sandbox runtime are skipped, as verifiers skips them when it scores without one.
"""

from __future__ import annotations

from typing import Any

from ..data.files import Row
from .base import KEY, EnvironmentFailure, Score, Settings, describe, prompt_messages
from .verifiers_score import score_conversation
from .verifiers_tools import ToolServers, tool_episode


class VerifiersEnvironment:
    verdict = None

    def __init__(self, settings: Settings):
        from pydantic import ValidationError
        from verifiers.v1 import Taskset, TasksetConfig
        from verifiers.v1.utils.generic import concrete_type

        self.settings, self.label = settings, f"verifiers:{settings.id}"
        try:
            cls = taskset_class(settings.id)
        except (ModuleNotFoundError, AttributeError, TypeError, ValueError) as e:
            known = f" Installed tasksets: {', '.join(installed())}." if isinstance(e, ModuleNotFoundError) else ""
            raise EnvironmentFailure("id", f"cannot load the verifiers taskset {settings.id!r}: {describe(e)}"
                                           f"{known}") from e
        self.config_type = concrete_type(cls, TasksetConfig, origin=Taskset) or TasksetConfig
        self.cls, self.task_cls = cls, cls.task_type()
        if getattr(self.task_cls, "NEEDS_CONTAINER", False):
            raise EnvironmentFailure("id", f"its tasks ({self.task_cls.__name__}) need a container (NEEDS_CONTAINER), "
                                           "which verifiers provisions through a sandbox runtime; episodes here run "
                                           "in this process, offline. Use a taskset whose tasks run without one")
        self.configs = {}
        for split, value in (("train", settings.split), ("eval", settings.eval_split)):
            fields = {"id": settings.id, **dict(settings.kwargs)}
            if value is not None:
                if "split" not in self.config_type.model_fields:
                    key = "split" if split == "train" else "eval_split"
                    raise EnvironmentFailure("id", f"environment.{key}={value!r}: the taskset's config "
                                                   f"{self.config_type.__name__} has no split field (its fields: "
                                                   f"{', '.join(self.fields())})")
                fields["split"] = value
            try:
                self.configs[split] = self.config_type.model_validate(fields)
            except ValidationError as e:
                raise EnvironmentFailure("id", f"environment.kwargs do not fit {self.config_type.__name__} (fields: "
                                               f"{', '.join(self.fields())}): {describe(e)}") from e
        config = self.configs["train"]
        self.multi_turn = bool(cls.toolsets(config) or self.task_cls.toolsets(config.task))
        self._tasks: dict[str, Any] = {}
        self._shared: dict[int, list] = {}

    def fields(self) -> list[str]:
        """The taskset config's own fields (what ``environment.kwargs`` may set)."""
        return [n for n in self.config_type.model_fields if n not in ("id", "task", "system_prompt")]

    def _taskset(self, split: str):
        try:
            return self.cls(self.configs[split])
        except Exception as e:  # noqa: BLE001 - the taskset's own code: reported as the environment's
            raise EnvironmentFailure("load", f"loading the taskset raised {describe(e)}") from e

    def tasks(self, split: str) -> list:
        """The training tasks, or the held-out ones (see the module docstring)."""
        s = self.settings
        taskset = self._taskset(split)
        if s.size is None and taskset.INFINITE and not (split == "eval" and s.eval_split is not None):
            raise EnvironmentFailure("load", "the taskset is infinite; set environment.size to the training tasks")
        try:
            if split == "train":
                if s.size is not None:
                    return list(taskset.take(s.size))
                tasks = list(taskset)
                held_out = s.eval_size if s.evaluate and s.eval_split is None else 0
                return tasks[: len(tasks) - held_out]
            if s.eval_split is not None:
                return list(taskset.take(s.eval_size))
            if s.size is not None:
                return list(taskset.skip(s.size).take(s.eval_size))
            return list(taskset)[-s.eval_size:]
        except Exception as e:  # noqa: BLE001 - the taskset's own load()
            raise EnvironmentFailure("load", f"the taskset's load() raised {describe(e)}") from e

    def prompt(self, task) -> list[dict]:
        s = self.settings
        system = task.data.system_prompt if s.system_prompt is None else (s.system_prompt or None)
        return prompt_messages(system, task.data.prompt)

    def rows(self, split: str) -> list[Row]:
        """One row per task: its prompt, and the fields its data class adds to ``vf.TaskData`` as columns (an
        ``answer``, a ``demonstration`` or ``demonstration_messages`` for the warm start, anything a reward
        function of ``reward.fn`` takes); ``answer`` only when every task has one."""
        from verifiers.v1 import TaskData

        tasks = self.tasks(split)
        if not tasks:
            raise EnvironmentFailure("load", f"the {split} split has no task")
        answers = [getattr(t.data, "answer", None) for t in tasks]
        with_answer = all(isinstance(a, str) and a.strip() for a in answers)
        out = []
        for i, task in enumerate(tasks):
            key = f"{split}/{i}"
            self._tasks[key] = task
            own = {n: getattr(task.data, n) for n in type(task.data).model_fields if n not in TaskData.model_fields}
            columns = {**{n: v for n, v in own.items() if n != "answer"}, "prompt": self.prompt(task), KEY: key}
            if with_answer:
                columns["answer"] = answers[i]
            name = task.data.name or task.data.id or f"idx {task.data.idx}"
            out.append(Row(columns, f"task {name} of {self.label} ({split})"))
        return out

    def task(self, key: Any):
        task = self._tasks.get(key)
        if task is None:
            raise EnvironmentFailure("score", f"no task {key!r} (a row this environment did not make)")
        return task

    async def shared_tools(self) -> list:
        """The taskset's own tool servers (``Taskset.toolsets``), started once per event loop and shared by
        its episodes, as agent tools."""
        import asyncio

        loop = asyncio.get_running_loop()
        if self._shared.get(id(loop)) is None:
            servers = ToolServers(self.label)
            for server in self.cls.toolsets(self.configs["train"]):
                await servers.add(server, None, owned=False)
            self._shared[id(loop)] = servers.tools
        return list(self._shared[id(loop)])

    async def episode(self, data: dict, client, record) -> float:
        return await tool_episode(self, self.task(data.get(KEY)), client, record)

    async def score(self, fields: dict, completion: str) -> Score:
        task = self.task(fields.get(KEY))
        return await score_conversation(task, [*self.prompt(task), {"role": "assistant", "content": completion}],
                                        sampled_from=len(self.prompt(task)))


def taskset_class(ident: str) -> type:
    """The ``vf.Taskset`` subclass ``ident`` names: an installed taskset id as verifiers resolves it, or a module
    path (``my_pkg.my_taskset``, which verifiers' own loader does not take) exporting one in ``__all__``."""
    import importlib

    from verifiers.v1 import Taskset
    from verifiers.v1.utils import loaders

    module = importlib.import_module(ident) if "." in ident and "/" not in ident and "@" not in ident else \
        loaders.import_taskset(ident)
    if callable(getattr(module, "load_environment", None)) and not _exports_taskset(module, Taskset):
        raise TypeError(f"{module.__name__!r} exports a module-level load_environment, the environment API of "
                        "verifiers before 0.4 (vf.SingleTurnEnv, vf.Rubric...), which verifiers 0.4 removed; its "
                        "tasksets export a vf.Taskset subclass in __all__. Port it to verifiers.v1 (vf.Taskset, "
                        "vf.Task with @vf.reward functions), or install the version of the package written for "
                        "verifiers 0.4")
    return loaders._plugin_class(module, Taskset, "taskset")


def _exports_taskset(module, base: type) -> bool:
    return any(isinstance(obj := getattr(module, name, None), type) and issubclass(obj, base) and obj is not base
               for name in getattr(module, "__all__", ()))


def installed() -> list[str]:
    """The taskset ids installed here: verifiers' built-in ones and the packages that require verifiers."""
    import pkgutil
    from importlib import metadata

    from verifiers.v1 import tasksets

    found = sorted(m.name for m in pkgutil.iter_modules(tasksets.__path__))
    for dist in metadata.distributions():
        requires = dist.requires or []
        if any(r.split(";")[0].strip().lower().startswith("verifiers") for r in requires):
            found.append(dist.metadata["Name"])
    return found or ["none"]
