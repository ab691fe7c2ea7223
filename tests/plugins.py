"""The user functions the tests name by import path (``tests.plugins.<name>``): advantage stages, loss
surrogates and whole losses, reward functions (also run in reward worker processes), workflows,
filters and an agent. ``tests/plugins_broken.py`` is the one module that fails to import, on purpose."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import time

import torch

from areal_trainer.advantage import AdvantageResult, OutcomeResult, TemporalResult
from areal_trainer.loss import PolicyLoss, PolicyLossResult, Stat, SurrogateResult

# -- advantage stages ------------------------------------------------------------------------------

NOT_CALLABLE = 42
SEEN: dict[str, object] = {}
"""What the recording functions saw last."""


def scale_outcome(inputs, *, factor: float) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"] * factor)


def int_outcome(inputs) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"].long())


def wrong_shape_outcome(inputs) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"][None].float())


def nan_outcome(inputs) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"].float() * float("nan"))


def mutating_outcome(inputs) -> OutcomeResult:
    inputs.data["loss_mask"].mul_(1)
    return OutcomeResult(rewards=inputs.data["rewards"].float())


def tuple_outcome(inputs):
    return (inputs.data["rewards"].float(),)


def nan_estimator(inputs) -> TemporalResult:
    bad = torch.full_like(inputs.values, float("nan"))
    return TemporalResult(advantages=bad, returns=inputs.values, total_rewards=inputs.values)


def zero_process(inputs, *, value: float = 0.0) -> torch.Tensor:
    return torch.full_like(inputs.advantages, value)


def short_process(inputs) -> torch.Tensor:
    return inputs.advantages[:, :-1]


def recording_lambda(ctx, *, value: float = 1.0) -> torch.Tensor:
    SEEN["lambda_ctx"] = ctx
    return torch.full_like(ctx.timestep_lengths, value)


def _result(inputs, **override) -> AdvantageResult:
    ids = inputs.data["input_ids"]
    zeros = torch.zeros(ids.shape)
    fields = dict(advantages=torch.ones(ids.shape), returns=zeros, loss_mask=zeros, logprobs=zeros,
                  outcome_rewards=torch.zeros(ids.shape[0]), total_rewards=zeros, kl_rewards=zeros)
    fields.update(override)
    return AdvantageResult(**fields)


def constant_advantages(inputs, *, value: float = 1.0) -> AdvantageResult:
    ids = inputs.data["input_ids"]
    return _result(inputs, advantages=torch.full(ids.shape, value))


def non_binary_mask(inputs) -> AdvantageResult:
    return _result(inputs, loss_mask=torch.full(inputs.data["input_ids"].shape, 0.5))


def overwriting_extras(inputs) -> AdvantageResult:
    return _result(inputs, extras={"input_ids": inputs.data["input_ids"], "prox_logp": torch.zeros(1)})


def inf_returns(inputs) -> AdvantageResult:
    return _result(inputs, returns=torch.full(inputs.data["input_ids"].shape, float("inf")))


def mutating_replacement(inputs) -> AdvantageResult:
    inputs.data["rewards"].add_(1)
    return _result(inputs)


def record_baseline(inputs):
    """A group baseline that records what it sees and returns the scores unchanged."""
    SEEN["baseline"] = {"scores": inputs.scores.tolist(), "rewards": inputs.rewards.tolist(),
                        "sizes": inputs.group_sizes}
    return inputs.scores


def wrong_shape_baseline(inputs):
    """A group baseline that returns one value per group instead of per row."""
    return inputs.scores[:1]

# -- policy losses ---------------------------------------------------------------------------------

def reinforce(x, *, scale: float = 1.0) -> SurrogateResult:
    """``-scale * A * r``: the plain importance-weighted policy gradient, no clip."""
    return SurrogateResult(-scale * x.advantages * x.ratio, {"actor/reinforce/scale": torch.tensor(scale)})


def declared_reinforce(x) -> SurrogateResult:
    """``-A * r`` with statistics made with their reductions: the largest ratio of the step (``Stat.max``, whatever
    the name), the tokens with a positive advantage (``Stat.sum``) and a plain mean of the ratio's mean."""
    loss = -x.advantages * x.ratio
    r = x.ratio.detach()
    mean = torch.where(x.mask, r, 0.0).sum() / x.mask.sum().clamp_min(1)
    return SurrogateResult(loss, {"actor/declared/largest_ratio": Stat.max(torch.where(x.mask, r, -torch.inf).amax()),
                                  "actor/declared/positive": Stat.sum((x.mask & (x.advantages > 0)).sum().float()),
                                  "actor/declared/ratio_mean": Stat.mean(mean)})


def max_with_a_weight(x) -> SurrogateResult:
    """A statistic declared as a maximum with a weight, which only a mean has."""
    return SurrogateResult(-x.advantages * x.ratio, {"actor/bad": Stat(x.ratio.detach().amax(), "max",
                                                                        x.n_valid)})


def wrong_shape(x) -> SurrogateResult:
    return SurrogateResult(x.ratio.sum(-1), {})


def nan_loss(x) -> SurrogateResult:
    return SurrogateResult(x.ratio * float("nan"), {})


def whole_loss(inputs, *, normalizer=None, weight: float = 1.0) -> PolicyLossResult:
    """The default loss, scaled: a whole-loss plugin that delegates."""
    res = PolicyLoss()(inputs, normalizer)
    return PolicyLossResult(weight * res.loss, {"actor/whole/weight": torch.tensor(weight)})


def vector_loss(inputs, *, normalizer=None) -> PolicyLossResult:
    return PolicyLossResult(inputs.logprobs.sum(-1), {})


def no_kwargs(x):
    return SurrogateResult(x.ratio, {})

# -- rewards, workflows and filters of the command-line tests --------------------------------------

def digit_share_reward(prompt: str, completion: str, answer: str) -> float:
    """The share of digits in the completion: varies between the answers of an untrained model, so every
    group has a reward signal (the task reward is 0 for almost all of them)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def picture_reward(prompt, completion, answer, images) -> float:
    """For image rows (tests/e2e/test_vlm.py): the share of digits in the answer's text, as
    :func:`digit_share_reward`; it takes the row's ``images`` column by name, which must be the list of paths."""
    if not (isinstance(images, list) and images and all(isinstance(p, str) and p.endswith(".png") for p in images)):
        raise ValueError(f"expected the row's image paths, got {images!r}")
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def length_thirds_reward(prompt: str, completion: str, answer: str) -> float:
    """0, 0.5 or 1 by the completion's length modulo 3: an untrained model's answers get each, so multi-turn
    episodes end at different turns, and a discounted 0.5 is not a power of the discount."""
    return (len(completion) % 3) / 2


def reject_all(group) -> bool:
    """A dynamic filter that accepts no group: with dynamic_bs every step has nothing to train on."""
    return False


def hanging_reward(prompt: str, completion: str, answer: str) -> float:
    """A reward function that never returns (in practice: a stuck external verifier)."""
    import time

    time.sleep(3600)
    return 0.0


class NoRolloutWorkflow:
    """A workflow class without the protocol's ``rollout`` method."""

    def __init__(self, *, engine, tokenizer, reward):
        pass


class WrongRolloutWorkflow(NoRolloutWorkflow):
    """``rollout`` without the gconfig argument."""

    def rollout(self, samples):
        return []

# -- rewards of the reward-execution tests ---------------------------------------------------------

def behave(mode: str, value: float = 1.0):
    """Do what ``mode`` says: return, hang, raise, or end the process in one of several ways."""
    if mode == "ok":
        return value
    if mode == "pid":
        return os.getpid()
    if mode == "hang":
        time.sleep(3600)
    if mode == "spin":
        while True:
            pass
    if mode == "raise":
        raise ValueError("cannot parse the completion")
    if mode == "exit":
        os._exit(1)
    if mode == "sys_exit":
        sys.exit(3)
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "oom_kill":  # what the kernel's OOM killer does
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "nan":
        return float("nan")
    if mode == "huge":  # finite in Python, infinite in float32
        return 1e39
    if mode == "none":
        return None
    if mode == "text":
        return "1.0"
    raise AssertionError(f"unknown mode {mode!r}")


def hang_with_child(pid_file: str):
    """Start a subprocess, write its pid, and hang: a timeout must kill the subprocess too."""
    child = subprocess.Popen(["sleep", "3600"])
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
    time.sleep(3600)


def beside(folder: str, n: int, mode: str, value: float = 1.0):
    """:func:`behave`, once this call has written its worker's pid into ``folder`` and ``n`` pids are there
    (``n`` calls side by side, each in its worker); it then also writes ``met-<pid>``. A test can wait until
    its calls run, and see that they ran at once."""
    with open(os.path.join(folder, str(os.getpid())), "w"):
        pass
    while len([name for name in os.listdir(folder) if name.isdigit()]) < n:
        time.sleep(0.001)
    with open(os.path.join(folder, f"met-{os.getpid()}"), "w"):
        pass
    return behave(mode, value)


_INSIDE = {"now": 0, "met": False}
"""The calls of :func:`io_meet` inside this worker's event loop, and whether two were there at once."""


async def io_meet() -> float:
    """An async reward that returns once two calls have been inside its worker's event loop at once (the
    number inside then): calls that ran one at a time would all wait until their deadline."""
    _INSIDE["now"] += 1
    try:
        while not (_INSIDE["met"] or _INSIDE["now"] >= 2):
            await asyncio.sleep(0.001)
        _INSIDE["met"] = True
        return float(_INSIDE["now"])
    finally:
        _INSIDE["now"] -= 1


async def io_wait(seconds: float, mode: str = "ok"):
    """An async reward waiting on (simulated) I/O; ``mode`` as in :func:`behave`, plus ``block``."""
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "block":  # blocks the worker's event loop: only killing the worker ends it
        time.sleep(3600)
    await asyncio.sleep(seconds)
    return behave(mode)


def by_completion(prompt, completion, answer, **kwargs):
    """Per-sample reward: the completion says what to do (``"ok:0.5"``, ``"hang"``, ``"raise"``...)."""
    mode, _, value = completion.partition(":")
    return behave(mode, float(value) if value else 1.0)


def exact(prompt, completion, answer):
    return 1.0 if completion.strip() == str(answer) else 0.0


def close_enough(prompt, completion, answer, tolerance=0.0):
    """Per-sample reward with a row field: 1.0 when the number is within ``tolerance`` of the answer."""
    return 1.0 if abs(float(completion) - float(answer)) <= tolerance else 0.0


def _text(completion):
    return completion[-1]["content"] if isinstance(completion, list) else completion


def accuracy(completions, solution, **kwargs):
    """TRL-style batched reward: 1.0 where the completion equals the row's ``solution`` column."""
    return [1.0 if _text(c).strip() == s else 0.0 for c, s in zip(completions, solution)]


def length_or_none(completions, **kwargs):
    """Batched: None (not applicable) for empty completions, else the length."""
    return [float(len(c)) if c else None for c in completions]


def echo_kwargs(prompt, completion, answer, **kwargs):
    return kwargs


def takes_solution(prompt, completion, answer, solution, scale=1.0):
    return scale * (completion == solution)


async def async_exact(prompt, completion, answer):
    await asyncio.sleep(0)
    return 1.0 if completion == answer else 0.0


async def async_batched(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [1.0] * len(completions)


def one_arg(completion):
    return 0.0


def two_args(prompt, completion):
    return 0.0


def wrong_length(completions, **kwargs):
    return [1.0]


def not_a_list(completions, **kwargs):
    return 1.0


def mixed_batch(completions, **kwargs):
    return [float("nan"), None, True, 2]


def says_text(prompt, completion, answer):
    return "1.0"


def positional_only(prompt, completion, answer, extra, /):
    return 0.0




def recorded_accuracy(prompts, completions, solution, **kwargs):
    """:func:`accuracy` that also appends what it was given (one JSON line per call) to ``$AREAL_TEST_RECORD``."""
    import json

    with open(os.environ["AREAL_TEST_RECORD"], "a") as f:
        f.write(json.dumps({"prompts": prompts, "completions": completions, "solution": solution,
                            "columns": sorted(kwargs)}) + "\n")
    return accuracy(completions, solution)


def tolerant(prompt, completion, answer, tolerance):
    """Per-sample reward with a row column: 1.0 when the completion's last number (0 without one) is within
    the row's ``tolerance`` of the answer's."""
    import re

    def last(text):
        found = re.findall(r"-?\d+", text)
        return float(found[-1]) if found else 0.0

    return 1.0 if abs(last(completion) - last(answer)) <= tolerance else 0.0


def by_mode(prompt, completion, answer, mode, **kwargs):
    """Per-sample reward that does what the row's ``mode`` column says (see :func:`behave`)."""
    return behave(mode)


def solution_only(completions, solution):
    return [float(c == s) for c, s in zip(completions, solution)]


_SEEN_GROUPS = [0]


def every_other_group(group) -> bool:
    """A dynamic filter that accepts every second group it sees (a batch of 2 prompts keeps one)."""
    _SEEN_GROUPS[0] += 1
    return _SEEN_GROUPS[0] % 2 == 1


def nan_gradient_loss(inputs, *, normalizer=None) -> PolicyLossResult:
    """A whole policy loss whose value is finite (0) but whose gradient is NaN: d sqrt|x| / dx at x = 0."""
    loss = (inputs.logprobs - inputs.logprobs.detach()).abs().sqrt().sum()
    return PolicyLossResult(loss, {})


def minus_one(prompt, completion, answer, **kwargs) -> float:
    """A reward of -1 whatever the answer."""
    return -1.0

# -- plugins whose output breaks its contract: each run stops with one `Error:` line naming it ------
# (tests/e2e/test_plugin_errors.py, and the unit tests beside the checks)


def nan_lambda(ctx) -> torch.Tensor:
    """An ``actor.gae_lambda`` function whose lambdas are NaN."""
    return torch.full_like(ctx.timestep_lengths, float("nan"))


def per_token_lambda(ctx) -> torch.Tensor:
    """An ``actor.gae_lambda`` function that returns one lambda per token instead of one per row."""
    return torch.ones(int(ctx.timestep_lengths.sum()) + 1)


def detached_loss(inputs, *, normalizer=None) -> PolicyLossResult:
    """A whole policy loss with the right value but cut from autograd (``.detach()``): no gradient."""
    res = PolicyLoss()(inputs, normalizer)
    return PolicyLossResult(res.loss.detach(), res.stats)


def leaf_loss(inputs, *, normalizer=None) -> PolicyLossResult:
    """A whole policy loss rebuilt as a new leaf tensor: ``requires_grad`` is set, but it reaches no weight."""
    value = PolicyLoss()(inputs, normalizer).loss.item()
    return PolicyLossResult(torch.tensor(value, requires_grad=True), {})


def detached_surrogate(x) -> SurrogateResult:
    """The plain policy gradient surrogate, detached: its per-token loss carries no gradient."""
    return SurrogateResult((-x.advantages * x.ratio).detach(), {})


class TextWorkflow:
    """A workflow whose ``rollout`` returns each prompt's text instead of a trajectory group."""

    def __init__(self, *, engine, tokenizer, reward):
        pass

    def rollout(self, samples, gconfig):
        return [str(s.get("prompt", s)) for s in samples]


# -- faults and signals of the command-line tests (tests/e2e/test_faults.py, test_agent_runs.py) -------

def nan_when_asked(x) -> SurrogateResult:
    """The plain policy gradient; with ``AREAL_TEST_NAN=1`` in the environment its gradient is NaN
    (d sqrt|t| / dt at t = 0), so every update of that run is skipped as non-finite."""
    loss = -x.advantages * x.ratio
    if os.environ.get("AREAL_TEST_NAN") == "1":
        loss = loss + (x.ratio - x.ratio.detach()).abs().sqrt()
    return SurrogateResult(loss, {})


def crashing_filter(group) -> bool:
    """A dynamic filter with a bug: the run crashes with a traceback."""
    return 1 / 0 > 0


def held_reward(prompt: str, completion: str, answer: str) -> float:
    """:func:`digit_share_reward` once the file ``$AREAL_TEST_RELEASE`` exists (waited for at most 300 s): the
    run stays in its first step, holding its run directory, until the test lets it go on."""
    deadline = time.monotonic() + 300
    while not os.path.exists(os.environ["AREAL_TEST_RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return digit_share_reward(prompt, completion, answer)


class ToolMarking:
    """An agent (tests/e2e/test_agent_runs.py) whose episode is one model call and then a tool that takes
    ``delay`` s and touches the file ``mark`` as it starts: a test can wait until an episode is in its tool."""

    def __init__(self, mark: str, delay: float = 0.2):
        self.mark, self.delay = mark, delay

    async def run(self, data, *, client):
        await client.chat.completions.create(model="policy", messages=data["messages"], max_tokens=4)
        with open(self.mark, "a"):
            pass
        await asyncio.sleep(self.delay)
        return 1.0


# -- on-policy distillation --------------------------------------------------------------------------
def never_called_reward(prompt, completion, answer) -> float:
    """Pure distillation must never call the reward: this one fails every call (the run then stops)."""
    raise RuntimeError("the reward was called during pure distillation")


def mopd_replacement(inputs) -> AdvantageResult:
    """A full advantage replacement that owns alignment, MOPD's behaviour log-probs included."""
    from areal_trainer.advantage.align import aligned_mask, old_logprobs
    from areal_trainer.advantage.distill import mopd_behavior_logprobs

    m = aligned_mask(inputs.data["loss_mask"])
    extras = {"mopd_behavior_logprobs": mopd_behavior_logprobs(inputs.data, m)} if inputs.mopd else {}
    return _result(inputs, loss_mask=m, logprobs=old_logprobs(inputs.old_logprobs, inputs.data, m),
                   advantages=m.clone(), extras=extras)


def trl_accuracy(completions, solution, **kwargs):
    """TRL-style batched reward (tests/e2e/test_trl_data.py): :func:`accuracy`; appends the ``solution`` and
    ``answer`` lists it was given (one JSON line per call) to ``$AREAL_TEST_RECORD`` when that is set."""
    import json

    if os.environ.get("AREAL_TEST_RECORD"):
        with open(os.environ["AREAL_TEST_RECORD"], "a") as f:
            f.write(json.dumps({"solution": solution, "answer": kwargs.get("answer")}) + "\n")
    return accuracy(completions, solution)


def solution_positional(prompt, completion, solution):
    """Per sample, its third positional parameter named like the answer column: the answer fills it."""
    return 1.0 if completion == solution else 0.0


def odd_length(prompt, completion, answer) -> float:
    """1 for a completion of odd length, else 0: a reward that varies within every group on any model."""
    return float(len(completion) % 2)
