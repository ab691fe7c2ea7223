"""Multi-turn answering with environment feedback, as an agent on the episode session: the model answers,
and while its final answer is wrong the environment replies with a fixed user message ("Your answer is
incorrect. Please try again.") and the model answers again, for at most ``max_turns`` answers.

Select it with ``rollout.workflow=areal_trainer.rollout.agents.multi_turn.MultiTurnWorkflow`` and set
``rollout.workflow_kwargs`` (``max_turns``, ``feedback``) and ``rollout.turn_discount`` (null: 0.9). Its
old path ``areal_trainer.rollout.workflows.multi_turn`` is an alias for a release (``moved.py``), and
``rollout.workflow_kwargs.turn_discount`` the key's old place (``components/rollout.py``).

Episodes. Each of the ``gconfig.n_samples`` samples of a prompt is an episode: the try-again agent
(:meth:`MultiTurnWorkflow.episode`, the task of ``examples/agents/try_again/agent.py``) on an
:class:`~areal_trainer.rollout.agents.session.EpisodeSession` with ``chat_template_type=concat``, so every
turn's prompt is the previous turn's exact ids (prompt, answer as sampled with its stop token) followed by
the template's tokens for the feedback only (``template.py``). All episodes of a rollout call run
concurrently; their requests are sampled together in episode order (``engines/batcher.py``, waiting for
every episode in flight), so turn ``k`` of every still-active episode is one ``engine.generate`` call, and
their answers are scored together likewise (:class:`Rendezvous`): one ``score_completions`` call per turn.
An episode ends when an answer earns a positive reward, after ``max_turns`` answers, or when the next
turn's prompt plus ``gconfig.max_new_tokens`` would exceed the row limit (``rollout/limits.py``). The
first answer has at most ``min(gconfig.max_new_tokens, limit - prompt tokens)`` tokens; later turns start
only with room for a whole answer, so no row exceeds the limit.

Reward. The reward of the last answer goes to the last call and is discounted backwards
(``trajectory.py``, AReaL's ``turn_discount``): the episode's reward is ``r * turn_discount ** (turns - 1)``,
so a right first answer is worth most. A negative ``r`` is discounted too (it shrinks towards 0 with
more turns; before this was an agent it was kept as is). Each reward source's own value of the last
answer, undiscounted, goes into the group's ``source_values``: the held-out accuracy counts an episode
right when its last answer is (right within the turns).

Rows. The episode's calls exported with ``rollout.agent_export=concat``: one row per episode,
token-aligned::

    prompt | answer 0 | feedback 1 | answer 1 | ... | answer n-1
    loss_mask:  0 | 1 | 0 | 1 | ... | 1       (model outputs only)
    turn_ids:  -1 | 0 | -1 | 1 | ... | n-1    (int32; -1 on prompt, feedback and padding)
    logprobs:   0 | behaviour logprobs of the sampled tokens | ...
    versions:  -1 | policy version of each sampled token | -1 | ...   (a turn may span a weight update)

``is_truncated`` is set when the last answer hit ``max_new_tokens`` without a stop token;
``num_turns`` ``[G]`` (float) counts the answers. The group's stats are the reward's counters and source
means of every answer (no ``agent/*`` counters: it is a workflow's group, one row per episode).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import UserError, integer_at_least
from ...metrics import reduce
from ..engines.batcher import GenerationBatcher
from ..limits import engine_positions, new_token_caps, row_tokens
from ..rows import Rows
from ..types import TrajectoryGroup
from .loop import EpisodeLoop
from .requests import parse_chat_request
from .session import EpisodeSession
from .template import Renderer, segment_text
from .tool_parsers import get_parser
from .trajectory import discounted_rewards, export_rows

DEFAULT_FEEDBACK = "Your answer is incorrect. Please try again."


class Rendezvous:
    """Calls ``fn(items) -> results`` once for the items of every episode in flight: a call starts when each
    episode that may still ask (``episodes()``) has asked, with the items in ``order``; :meth:`wake` when an
    episode ends. ``fn`` runs in a worker thread."""

    def __init__(self, fn: Callable[[list], list], episodes: Callable[[], int]):
        self.fn, self.episodes = fn, episodes
        self._queue: list[tuple[tuple, Any, asyncio.Future]] = []
        self._tasks: set[asyncio.Task] = set()

    async def __call__(self, order: tuple, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((order, item, future))
        self.wake()
        return await future

    def wake(self) -> None:
        if not self._queue or len(self._queue) < self.episodes():
            return
        batch, self._queue = sorted(self._queue, key=lambda x: x[0]), []
        task = asyncio.get_running_loop().create_task(self._call(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, batch: list[tuple[tuple, Any, asyncio.Future]]) -> None:
        try:
            results = await asyncio.to_thread(self.fn, [item for _, item, _ in batch])
        except BaseException as e:  # noqa: BLE001 - every waiting episode gets the error
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        for (_, _, future), result in zip(batch, results):
            if not future.done():
                future.set_result(result)


@dataclass
class Scored:
    """An answer's reward, its reward metrics (counters and source means) and each source's own value."""

    reward: float
    stats: dict
    values: dict[str, float | None]


@dataclass
class Episode:
    """One episode's session (its recorded calls) and the scores of its answers, in order."""

    session: EpisodeSession
    scores: list[Scored] = field(default_factory=list)


class MultiTurnWorkflow:
    """Multi-turn answering with "try again" feedback after every wrong answer (see the module docstring).

    Args:
        engine: rollout engine (``InferenceEngine``: ``generate(prompts, gconfig) -> list[Generation]``).
        tokenizer: the policy's tokenizer (with a chat template).
        reward: the run's reward service (``score_completions(rows, texts) -> scores``, ``reward/service.py``).
        max_turns: most answers per episode (>= 1; 1 is single-turn answering).
        turn_discount: the per-call discount in (0, 1] (``rollout.turn_discount``).
        feedback: content of the user message sent after a wrong answer.
    """

    def __init__(self, *, engine, tokenizer, reward, max_turns: int = 2, turn_discount: float = 0.9,
                 feedback: str = DEFAULT_FEEDBACK):
        bad = integer_at_least("rollout.workflow_kwargs.max_turns", max_turns, 1)
        if bad:
            raise UserError(bad[0])
        if (isinstance(turn_discount, bool) or not isinstance(turn_discount, (int, float))
                or not math.isfinite(turn_discount) or not 0 < turn_discount <= 1):
            raise UserError(f"rollout.turn_discount: got {turn_discount!r}; must be a number in (0, 1].")
        if not isinstance(feedback, str) or not feedback.strip():
            raise UserError(f"rollout.workflow_kwargs.feedback: got {feedback!r}; must be a non-empty string.")
        self.engine, self.tokenizer, self.reward = engine, tokenizer, reward
        self.max_turns, self.turn_discount, self.feedback = max_turns, float(turn_discount), feedback
        self.parser = get_parser("hermes")  # never used: the episodes offer no tools
        self._loop: EpisodeLoop | None = None

    # -- rollout ----------------------------------------------------------------------------------
    def rollout(self, samples: list[dict], gconfig: Any) -> list[TrajectoryGroup]:
        """One group per sample: ``[G, L]`` rows (``G = gconfig.n_samples``), ``rewards``,
        ``is_truncated`` and ``num_turns`` ``[G]``; its stats combine the reward's counters and source means
        of every answer."""
        for s in samples if self.max_turns > 1 else ():
            if segment_text(self.tokenizer, s["messages"], [self._feedback_message()], []) is None:
                raise UserError("MultiTurnWorkflow: the tokenizer's chat template does not render an assistant "
                                "message's content verbatim, so the feedback turn cannot be placed after the "
                                "model's answer.")
        if self._loop is None:
            self._loop = EpisodeLoop(name="areal-multi-turn-loop")
        return self._loop.run(self._rollout(samples, gconfig), notice_s=math.inf, abandon_s=None)

    async def _rollout(self, samples: list[dict], gconfig: Any) -> list[TrajectoryGroup]:
        g = gconfig.n_samples
        total, ended = len(samples) * g, [0]
        batcher = GenerationBatcher(self.engine, episodes=lambda: total - ended[0])
        scorer = Rendezvous(self._score, episodes=lambda: total - ended[0])
        renderer = Renderer(self.tokenizer)  # a prompt's episodes render its prompt and feedback once

        async def run(index: int, sample: dict) -> Episode:
            session = EpisodeSession(episode=index, tokenizer=self.tokenizer, batcher=batcher, gconfig=gconfig,
                                     parser=self.parser, max_calls=self.max_turns, chat_template_type="concat",
                                     renderer=renderer)
            try:
                return await self.episode(sample, session, scorer, gconfig)
            finally:
                ended[0] += 1
                batcher.wake()
                scorer.wake()

        try:
            episodes = await asyncio.gather(*(run(i * g + j, samples[i]) for i in range(len(samples))
                                              for j in range(g)))
        finally:
            await batcher.close()
        return [self._group(episodes[i * g:(i + 1) * g]) for i in range(len(samples))]

    def _feedback_message(self) -> dict:
        return {"role": "user", "content": self.feedback}

    async def episode(self, sample: dict, session: EpisodeSession, scorer: Rendezvous, gconfig: Any) -> Episode:
        """The try-again agent: answer; while the answer is wrong, turns remain and the next prompt leaves room
        for a whole answer, hear the feedback and answer again."""
        out = Episode(session)
        limit = row_tokens(gconfig, engine_positions(self.engine))
        messages = [dict(m) for m in sample["messages"]]
        for turn in range(self.max_turns):
            request = parse_chat_request({"messages": messages})
            prompt, _, _ = session.prompt_of(request)
            if turn == 0:
                new_token_caps([len(prompt)], gconfig, engine_positions(self.engine))  # a prompt with no room: raises
            elif len(prompt) + gconfig.max_new_tokens > limit:
                break
            completion = await session.create(request)
            answer = completion.choices[0].message.content or ""
            out.scores.append(await scorer((session.episode,), (sample, answer)))
            if out.scores[-1].reward > 0:
                break
            messages += [{"role": "assistant", "content": answer}, self._feedback_message()]
        return out

    def _score(self, items: list[tuple[dict, str]]) -> list[Scored]:
        scores = self.reward.score_completions([s for s, _ in items], [text for _, text in items])
        return [Scored(float(r), scores.typed(j, j + 1), {name: v[j] for name, v in scores.values.items()})
                for j, r in enumerate(scores.rewards)]

    def _group(self, episodes: list[Episode]) -> TrajectoryGroup:
        rows = []
        for e in episodes:
            rewards = [None] * (len(e.scores) - 1) + [e.scores[-1].reward]
            exported, _ = export_rows(e.session.records, discounted_rewards(rewards, self.turn_discount), "concat")
            if len(exported) != 1:  # concat prompts always extend their row; anything else is a bug here
                raise RuntimeError(f"MultiTurnWorkflow: an episode of {len(e.scores)} answers became "
                                   f"{len(exported)} rows")
            rows += exported
        built = Rows.from_segments([r.segments for r in rows], rewards=[r.reward for r in rows],
                                   truncated=[r.truncated for r in rows], num_turns=[r.calls for r in rows])
        # An episode is right when its last answer is (it stops at the first right one): the sources' values
        # of that answer, undiscounted, are what a verifier's held-out accuracy reads.
        last = [e.scores[-1].values for e in episodes]
        values = {name: tuple(v.get(name) for v in last) for name in last[0]}
        return TrajectoryGroup(built, stats=reduce([s.stats for e in episodes for s in e.scores]), source_values=values)

    def close(self) -> None:
        """Close the episodes' event loop (the trainer calls this when the run ends)."""
        if self._loop is not None:
            loop, self._loop = self._loop, None
            loop.close()
