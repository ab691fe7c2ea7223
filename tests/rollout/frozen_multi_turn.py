"""FROZEN: ``areal_trainer/rollout/workflows/multi_turn.py`` as it was before the workflow became an agent
on the episode session (``areal_trainer/rollout/agents/multi_turn.py``), kept unchanged (its imports made
absolute) so that ``tests/rollout/test_multiturn_identity.py`` compares the two on the same model and seed.
Do not edit it.

Multi-turn rollout with environment feedback: the model answers, and while its final answer is
wrong the environment replies with a fixed user message ("Your answer is incorrect. Please try
again.") and the model answers again, for at most ``max_turns`` answers.

Select it with ``rollout.workflow=areal_trainer.rollout.workflows.multi_turn.MultiTurnWorkflow`` and set its
keyword arguments through ``rollout.workflow_kwargs`` (``max_turns``, ``turn_discount``, ``feedback``).

Episodes. Each of the ``gconfig.n_samples`` samples of a prompt is an independent episode. Turn
``k`` of every still-active episode of the whole batch is sampled in one batched
``engine.generate`` call. An episode ends when an answer earns a positive reward, after
``max_turns`` answers, or when the next turn's prompt plus ``gconfig.max_new_tokens`` would exceed
the row limit (``rollout/limits.py``: ``gconfig.max_tokens`` or the model's positions, the smaller). The first
answer has at most ``min(gconfig.max_new_tokens, limit - prompt tokens)`` tokens; later turns start
only with room for a whole answer, so no row exceeds the limit.

Reward. The reward of the last answer ``r``, discounted once per extra turn when it is positive:
``r * turn_discount ** (num_turns - 1)``, so a right first answer is worth most. A non-positive
reward is kept as is (discounting a negative reward would favour more turns). Each reward source's own
value of the last answer, undiscounted, goes into the group's ``source_values``: the held-out accuracy
counts an episode right when its last answer is (right within the turns).

Rows. One trajectory row per episode, token-aligned (``rollout/batch.py``)::

    prompt | answer 0 | feedback 1 | answer 1 | ... | answer n-1
    loss_mask:  0 | 1 | 0 | 1 | ... | 1       (model outputs only)
    turn_ids:  -1 | 0 | -1 | 1 | ... | n-1    (int32; -1 on prompt, feedback and padding)
    logprobs:   0 | behaviour logprobs of the sampled tokens | ...
    versions:  -1 | policy version of each sampled token | -1 | ...   (a turn may span a weight update)

``is_truncated`` is set when the last answer hit ``max_new_tokens`` without a stop token;
``num_turns`` ``[G]`` (float) counts the answers.

Chat template. The prompt is the chat-template rendering of the sample's messages with the
generation prompt. The model's answers are kept exactly as sampled, including the stop token they
end with. A feedback segment is the template's text between an assistant message's content and the
next assistant message's content: the end of the assistant turn, the rendered user message and the
opening of the next assistant turn, tokenized on its own. When the answer ends with the token the
feedback segment starts with (the template's end-of-turn token is the tokenizer's EOS, as for Qwen
and other ChatML models: ``<|im_end|>``), that token is dropped from the feedback segment, so the
row is exactly the template's rendering of the whole conversation. When the stop token differs
(the built-in tokenizer stops with ``<eos>`` and closes turns with ``<|im_end|>``), the row is the
template's rendering with the model's stop token kept after each answer's content. A truncated
answer (no stop token) is followed by the full feedback segment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from areal_trainer.errors import UserError, integer_at_least
from areal_trainer.metrics import reduce
from areal_trainer.model.chat import prompt_ids
from areal_trainer.rollout.limits import capped, engine_positions, new_token_caps, row_tokens
from areal_trainer.rollout.rows import Rows, Segment
from areal_trainer.rollout.types import TrajectoryGroup, answer_segment

DEFAULT_FEEDBACK = "Your answer is incorrect. Please try again."
_SENTINEL = "\x00assistant-answer\x00"
"""Stands in for an answer's content when rendering the template to find the feedback text."""


@dataclass
class Episode:
    """One sampled conversation of one prompt.

    Attributes:
        sample: index of its prompt in the rollout's ``samples``.
        segments: the pieces of its row, in order (prompt, answers, feedback).
        context: every token so far (the prompt of its next turn).
        rewards: the raw reward of each answer.
        truncated: whether the latest answer hit ``max_new_tokens`` without a stop token.
        active: whether it takes another turn.
    """

    sample: int
    segments: list[Segment]
    context: list[int]
    rewards: list[float] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)
    """The reward's metrics of each of its answers (counters and source means)."""
    values: dict[str, float | None] = field(default_factory=dict)
    """Each reward source's own value for its latest answer (the one that ended it, once it has ended)."""
    truncated: bool = False
    active: bool = True

    @property
    def num_turns(self) -> int:
        return len(self.rewards)


class MultiTurnWorkflow:
    """Multi-turn answering with "try again" feedback after every wrong answer.

    Args:
        engine: rollout engine (``InferenceEngine``: ``generate(prompts, gconfig) -> list[Generation]``).
        tokenizer: the policy's tokenizer (with a chat template).
        reward: the run's reward service (``score_completions(rows, texts) -> scores``, ``reward/service.py``).
        max_turns: most answers per episode (>= 1; 1 is single-turn answering).
        turn_discount: factor in (0, 1] applied to a positive reward once per extra turn.
        feedback: content of the user message sent after a wrong answer.
    """

    def __init__(self, *, engine, tokenizer, reward, max_turns: int = 2, turn_discount: float = 0.9,
                 feedback: str = DEFAULT_FEEDBACK):
        bad = integer_at_least("rollout.workflow_kwargs.max_turns", max_turns, 1)
        if bad:
            raise UserError(bad[0])
        if (isinstance(turn_discount, bool) or not isinstance(turn_discount, (int, float))
                or not math.isfinite(turn_discount) or not 0 < turn_discount <= 1):
            raise UserError(f"rollout.workflow_kwargs.turn_discount: got {turn_discount!r}; must be a number "
                            "in (0, 1].")
        if not isinstance(feedback, str) or not feedback.strip():
            raise UserError(f"rollout.workflow_kwargs.feedback: got {feedback!r}; must be a non-empty string.")
        self.engine, self.tokenizer, self.reward = engine, tokenizer, reward
        self.max_turns, self.turn_discount, self.feedback = max_turns, float(turn_discount), feedback

    # -- chat template ----------------------------------------------------------------------------
    def feedback_text(self, messages: list[dict]) -> str:
        """Template text between an answer's content and the next answer's content, after ``messages``."""
        conversation = [*messages, {"role": "assistant", "content": _SENTINEL},
                        {"role": "user", "content": self.feedback}]
        text = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        if text.count(_SENTINEL) != 1:
            raise UserError("MultiTurnWorkflow: the tokenizer's chat template does not render an assistant message's "
                            "content verbatim, so the feedback turn cannot be placed after the model's answer.")
        return text[text.index(_SENTINEL) + len(_SENTINEL):]

    def feedback_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of ``feedback_text(messages)``."""
        return self.tokenizer(self.feedback_text(messages), add_special_tokens=False).input_ids

    @staticmethod
    def joined_feedback(feedback: list[int], output_ids: list[int], truncated: bool) -> list[int]:
        """The feedback tokens to append after an answer, without repeating its end-of-turn token."""
        if not truncated and output_ids and feedback and output_ids[-1] == feedback[0]:
            return feedback[1:]
        return feedback

    def episode_reward(self, episode: Episode) -> float:
        """The last answer's reward, discounted per extra turn when positive."""
        r = episode.rewards[-1]
        return r * self.turn_discount ** (episode.num_turns - 1) if r > 0 else r

    # -- rollout ----------------------------------------------------------------------------------
    def rollout(self, samples: list[dict], gconfig: Any) -> list[TrajectoryGroup]:
        """One group per sample: ``[G, L]`` rows (``G = gconfig.n_samples``), ``rewards``,
        ``is_truncated`` and ``num_turns`` ``[G]``; its stats combine the reward's counters and source means
        of every answer."""
        g = gconfig.n_samples
        prompts = [prompt_ids(self.tokenizer, s["messages"]) for s in samples]
        feedback = [self.feedback_ids(s["messages"]) for s in samples] if self.max_turns > 1 else [[] for _ in samples]
        episodes = [Episode(i, [Segment(prompts[i])], list(prompts[i])) for i in range(len(samples))
                    for _ in range(g)]
        for turn in range(self.max_turns):
            active = [e for e in episodes if e.active]
            if not active:
                break
            caps = new_token_caps([len(e.context) for e in active], gconfig, engine_positions(self.engine))
            gens = capped(self.engine.generate([e.context for e in active], gconfig), caps)
            texts = [self.tokenizer.decode(x.output_ids, skip_special_tokens=True) for x in gens]
            scores = self.reward.score_completions([samples[e.sample] for e in active], texts)
            for j, (e, x, r) in enumerate(zip(active, gens, scores.rewards)):
                e.stats.append(scores.typed(j, j + 1))
                e.values = {name: v[j] for name, v in scores.values.items()}
                self._advance(e, x, float(r), turn, feedback[e.sample], gconfig)
        return [self._group(episodes[i * g:(i + 1) * g]) for i in range(len(samples))]

    def _advance(self, e: Episode, gen, reward: float, turn: int, feedback: list[int],
                 gconfig: Any) -> None:
        """Record answer ``turn`` of ``e``; append the feedback when the episode goes on."""
        e.segments.append(answer_segment(gen, turn))
        e.context += gen.output_ids
        e.rewards.append(reward)
        e.truncated = bool(gen.truncated)
        e.active = False
        if reward > 0 or turn + 1 >= self.max_turns:
            return
        env = self.joined_feedback(feedback, gen.output_ids, gen.truncated)
        if len(e.context) + len(env) + gconfig.max_new_tokens > row_tokens(gconfig, engine_positions(self.engine)):
            return
        e.segments.append(Segment(env))
        e.context += env
        e.active = True

    def _group(self, episodes: list[Episode]) -> TrajectoryGroup:
        rows = Rows.from_segments([e.segments for e in episodes], rewards=[self.episode_reward(e) for e in episodes],
                                  truncated=[e.truncated for e in episodes],
                                  num_turns=[e.num_turns for e in episodes])
        # An episode is right when its last answer is (it stops at the first right one): the sources' values
        # of that answer, undiscounted, are what a verifier's held-out accuracy reads.
        values = {name: tuple(e.values.get(name) for e in episodes) for name in episodes[0].values}
        return TrajectoryGroup(rows, stats=reduce([s for e in episodes for s in e.stats]), source_values=values)
