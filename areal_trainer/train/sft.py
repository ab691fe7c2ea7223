"""Supervised warm start: a few hundred steps of teacher forcing on the training set's
demonstrations (the reference answers, unless the dataset provides separate demonstrations), so
that a randomly initialised built-in model learns the answer format before RL.

The loss is the mean negative log-likelihood of the answer tokens (the prompt is not trained on).

Which rows. The warm start trains on the rows that have something to imitate: a reference answer as text
(``train_dataset.answer_key``), a ``demonstration`` column or a ``demonstration_messages`` conversation.
:func:`plan_warm_start` decides it from the samples before the policy's weights load: the rows it uses (a
notice says how many when some have nothing), and for data with nothing to imitate in any row either a
skipped warm start (``sft_warmup.steps`` null: a notice says why) or, with ``sft_warmup.steps`` set above
0, a configuration error.

Conversations. A row whose ``demonstration_messages`` column holds the turns that follow its prompt
(assistant turns, tool results, ..., with the tools offered in ``demonstration_tools``) is rendered whole
by the chat template and trained on its assistant turns only, each through the end-of-sequence token
that ends a sampled answer. The tool-calling built-in models (``builtin:<size>-tools``) on the built-in
task get such rows from the teacher (``data/arith.py``: :func:`~areal_trainer.data.arith.tool_demonstration`),
so their warm start teaches the calculator conversation; every other run trains on text as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..config.schema import SFTWarmupConfig
from ..data.datasets import demonstration
from ..errors import ConfigError, UserError
from ..model.builtin import has_tools, is_builtin
from ..model.vision import prompt_inputs
from ..rollout.rows import Segment, make_row, stack_rows
from .models.logprobs import forward_logprobs
from .models.optim import lr_factor
from .sft_cache import cache_root, kernel_identity, load_cached, store_cached, warmstart_key

__all__ = ["cache_root", "kernel_identity", "load_cached", "store_cached", "warm_start", "warmstart_key"]

DEFAULT_SFT_STEPS = 300
"""Warm-start steps for built-in (randomly initialised) models when ``sft_warmup.steps`` is null."""


def conversation_segments(tokenizer, messages: list[dict], tools: list | None = None) -> list[Segment]:
    """A conversation as row segments: each assistant turn trained (its tokens through the first
    end-of-sequence token, or the whole turn when it has none), the other tokens not; nothing after the
    last assistant turn. The template must render every prefix of the conversation as a prefix of it."""
    from ..model.chat import template_message  # tool-call arguments as the template expects them

    messages = [template_message(dict(m)) for m in messages]
    kwargs = {"tools": tools} if tools else {}

    def ids(upto: int, opening: bool) -> list[int]:
        text = tokenizer.apply_chat_template(messages[:upto], add_generation_prompt=opening, tokenize=False, **kwargs)
        return tokenizer(text, add_special_tokens=False).input_ids

    full, segments, pos = ids(len(messages), False), [], 0
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before, through = ids(k, True), ids(k + 1, False)
        if full[:len(before)] != before or full[:len(through)] != through:
            raise UserError(f"sft_warmup: the chat template renders turn {k + 1} of a demonstration conversation "
                            "differently alone than within the whole conversation, so its tokens cannot be told apart.")
        turn = full[len(before):len(through)]
        if tokenizer.eos_token_id in turn:
            turn = turn[:turn.index(tokenizer.eos_token_id) + 1]
        segments += [Segment(full[pos:len(before)]),
                     Segment(turn, True, [0.0] * len(turn), [0] * len(turn), sum(s.trainable for s in segments))]
        pos = len(before) + len(turn)
    return segments


def with_tool_demonstrations(samples: list[dict]) -> list[dict]:
    """The built-in task's samples with the teacher's calculator conversations as their demonstrations."""
    from ..data.arith import CALC_TOOL, tool_demonstration

    return [{**s, "fields": {**s["fields"], "demonstration_messages": tool_demonstration(demonstration(s)),
                             "demonstration_tools": [CALC_TOOL]}} for s in samples]


@dataclass(frozen=True)
class WarmStartPlan:
    """What the warm start does, decided from the samples before any weights load (:func:`plan_warm_start`)."""

    steps: int
    """Its steps; 0: no warm start."""
    samples: list[dict] = field(default_factory=list)
    """The rows it trains on: those with something to imitate."""
    notice: str | None = None
    """A line for the console: rows left out, or why it is skipped."""
    problems: tuple[str, ...] = ()
    """Configuration problems: the run cannot start."""


def warm_start_steps(cfg) -> int:
    """The steps ``cfg`` (a ``TrainerConfig``) asks for: ``sft_warmup.steps``, by default
    :data:`DEFAULT_SFT_STEPS` for built-in models and none for others."""
    steps = cfg.sft_warmup.steps
    return steps if steps is not None else (DEFAULT_SFT_STEPS if is_builtin(cfg.actor.path) else 0)


def _conversation_problem(sample: dict) -> str | None:
    conversation = sample["fields"].get("demonstration_messages")
    if conversation is None or (isinstance(conversation, list) and any(
            isinstance(m, dict) and m.get("role") == "assistant" for m in conversation)):
        return None
    return (f"sft_warmup: {sample['row']}: 'demonstration_messages' must be a list of chat messages (the turns "
            f"after the prompt) with an assistant turn, got {conversation!r:.200}.")


def imitable(sample: dict) -> bool:
    """Whether a row has something to imitate: a ``demonstration_messages`` conversation, or a text
    (its ``demonstration`` column, else its reference answer)."""
    if sample["fields"].get("demonstration_messages") is not None:
        return True
    target = demonstration(sample)
    return isinstance(target, str) and bool(target.strip())


# What counts, in the words of every notice and problem below.
IMITATE = ("something to imitate (a reference answer as text, named by {key}.answer_key; a 'demonstration' "
           "column; or a 'demonstration_messages' conversation)")


def plan_warm_start(samples: list[dict], cfg, key: str = "train_dataset") -> WarmStartPlan:
    """The warm start ``cfg`` (a ``TrainerConfig``) asks for on ``samples`` (see the module docstring)."""
    steps = warm_start_steps(cfg)
    if steps <= 0:
        return WarmStartPlan(0)
    bad = [p for s in samples if (p := _conversation_problem(s))]
    more = f" ({len(bad) - 1} more of the {len(samples)} rows have such problems too.)" if len(bad) > 1 else ""
    problems = (bad[0] + more,) if bad else ()
    usable = [s for s in samples if imitable(s)]
    what = IMITATE.format(key=key)
    if not usable and cfg.sft_warmup.steps is None:
        return WarmStartPlan(0, notice=(
            f"SFT warm start skipped: no row of {key} has {what}, so the built-in model starts RL untrained. Add an "
            f"answer column ({key}.answer_key=<column>) or a 'demonstration' column to warm it up, or set "
            "sft_warmup.steps=0 to skip the warm start without this notice."))
    if not usable:
        return WarmStartPlan(0, problems=(*problems, (
            f"sft_warmup.steps={steps}: no row of {key} ({key}.path={getattr(cfg, key).path!r}) has {what}, so the "
            f"warm start has nothing to train on. Add an answer column ({key}.answer_key=<column>) or a "
            "'demonstration' column, or set sft_warmup.steps=0 (no warm start).")))
    notice = None
    if len(usable) < len(samples):
        notice = (f"SFT warm start: on the {len(usable)} of {len(samples)} rows of {key} that have {what}; the "
                  f"other {len(samples) - len(usable)} have none.")
    return WarmStartPlan(steps, usable, notice, problems)


def sft_batch(samples: list[dict], tokenizer) -> dict[str, torch.Tensor]:
    """Prompt + reference answer + EOS rows; ``loss_mask`` marks the answer tokens (a demonstration
    conversation: its assistant turns, see the module docstring)."""
    return stack_rows(sft_rows(samples, tokenizer)[0])


def sft_rows(samples: list[dict], tokenizer) -> tuple[list[dict[str, torch.Tensor]], list]:
    """The rows of :func:`sft_batch`, unstacked, and each row's images (``model/vision.py``; None for a text row):
    an image prompt is trained on with its images, as RL samples it."""
    rows, vision = [], []
    for s in samples:
        if s.get("vision") is not None and s["vision"].refs and s["fields"].get("demonstration_messages") is not None:
            raise UserError(f"sft_warmup: {s['row']} has images and a 'demonstration_messages' conversation; the warm "
                            "start trains image rows on a text demonstration or answer only. Drop the conversation "
                            "column for image rows, or set sft_warmup.steps=0.")
        conversation = s["fields"].get("demonstration_messages")
        if conversation is not None:
            if (problem := _conversation_problem(s)) is not None:
                raise UserError(problem)
            rows.append(make_row(conversation_segments(tokenizer, s["messages"] + conversation,
                                                       s["fields"].get("demonstration_tools"))))
            vision.append(None)
            continue
        target = demonstration(s)
        if not isinstance(target, str):
            raise UserError(f"sft_warmup: {s['row']} has no reference answer to imitate (train_dataset.answer_key, "
                            "or a 'demonstration' column); set sft_warmup.steps=0 for data without answers.")
        answer = tokenizer(target, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        prompt, images = prompt_inputs(tokenizer, s)
        rows.append(make_row([Segment(prompt), Segment(answer, True, [0.0] * len(answer), [0] * len(answer), 0)]))
        vision.append(images)
    return rows, vision


def sft_optimizer(model, cfg: SFTWarmupConfig, steps: int):
    """The warm start's AdamW and its schedule (linear warm-up, cosine decay to a tenth) over ``steps`` steps."""
    from ..config.parts import OptimizerConfig

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    sched_cfg = OptimizerConfig(lr=cfg.lr, lr_scheduler_type="cosine", min_lr_ratio=0.1,
                                warmup_steps_proportion=min(1.0, cfg.warmup_steps / max(steps, 1)))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, sched_cfg))


def sft_step(model, batch: dict[str, torch.Tensor], vision: list, opt, sched, autocast_dtype=None) -> float:
    """One warm-start step on a stacked batch (:func:`stack_rows`): the mean negative log-likelihood of its
    ``loss_mask`` tokens, clipped at norm 1; returns the loss."""
    logp, _ = forward_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=1.0,
                               autocast_dtype=autocast_dtype, vision=vision)
    mask = torch.roll(batch["loss_mask"], -1, dims=1)  # position t predicts token t+1
    mask[:, -1] = 0
    loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())


def sft_warmup(model, tokenizer, samples: list[dict], cfg: SFTWarmupConfig, *, steps: int, seed: int,
               device: torch.device, autocast_dtype=None, progress: bool = True) -> list[float]:
    """Train ``model`` in place for ``steps`` steps; returns the loss of every step."""
    opt, sched = sft_optimizer(model, cfg, steps)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    # Each text row is tokenized once, the first time it is drawn: rendering the chat template (several times
    # for a demonstration conversation) took about a sixth of a step on the built-in models. Image rows are
    # not kept (their images can be large) and are made again at every draw.
    made: dict[int, dict[str, torch.Tensor]] = {}

    def row(i: int) -> tuple[dict[str, torch.Tensor], object]:
        if i in made:
            return made[i], None
        (r,), (images,) = sft_rows([samples[i]], tokenizer)
        if images is None:
            made[i] = r
        return r, images

    model.train()
    bar = tqdm(range(steps), desc="SFT warm start", disable=not progress, dynamic_ncols=True)
    for _ in bar:
        idx = torch.randint(len(samples), (cfg.batch_size,), generator=gen).tolist()
        rows, vision = map(list, zip(*map(row, idx)))
        batch = {k: v.to(device) for k, v in stack_rows(rows).items()}
        losses.append(sft_step(model, batch, vision, opt, sched, autocast_dtype))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def warm_start(model, tokenizer, samples: list[dict], cfg, *, device: torch.device, autocast_dtype=None,
               plan: WarmStartPlan | None = None) -> dict:
    """The warm start ``cfg`` (a ``TrainerConfig``) asks for, in place on ``model``, reusing an identical
    cached one for built-in models; returns its metrics for step 0 (empty when there is none). ``plan``: the
    one the run decided before the weights loaded (and announced); without one it is decided here."""
    if plan is None:
        plan = plan_warm_start(samples, cfg)
        if plan.problems:
            raise ConfigError(list(plan.problems))
        if plan.notice:
            print(f"notice: {plan.notice}", flush=True)
    sft, steps, samples = cfg.sft_warmup, plan.steps, plan.samples
    if steps <= 0:
        return {}
    env = cfg.environment.type is not None  # an environment's rows are its own: they bring their demonstrations
    if has_tools(cfg.actor.path) and cfg.train_dataset.path == "builtin:arith" and not env:
        samples = with_tool_demonstrations(samples)
    key = None
    t0 = time.time()
    if sft.cache and is_builtin(cfg.actor.path):
        what = {"actor": cfg.actor.path, "seed": cfg.seed, "steps": steps, "sft": sft, "data": cfg.train_dataset,
                "device": device.type, "dtype": cfg.actor.dtype}
        key = warmstart_key({**what, "environment": cfg.environment} if env else what)
        cached = load_cached(model, key)
        if cached is not None:
            return _reused(key, cached, time.time() - t0)
    losses = sft_warmup(model, tokenizer, samples, sft, steps=steps, seed=cfg.seed, device=device,
                        autocast_dtype=autocast_dtype, progress=cfg.stats_logger.progress_bar)
    metrics = {"sft/loss": losses[-1], "sft/steps": steps, "time/sft": time.time() - t0}
    if key is not None:
        store_cached(model, key, metrics)
    return {**metrics, "sft/cached": 0.0}


def _reused(key: str, cached: dict, took: float) -> dict:
    """Step 0's metrics for a reused warm start: ``time/sft`` is what this run spent (loading it), so
    a cache hit never reads as hundreds of seconds of training; the duration of the run that computed
    it moves to ``sft/cached_original_time``."""
    original = cached.get("time/sft")
    computed = f"computed earlier in {original:.0f} s, " if original is not None else ""
    print(f"SFT warm start: reused the identical warm start {key} ({computed}loaded in {took:.1f} s; "
          "sft_warmup.cache=false recomputes it)", flush=True)
    metrics = {k: v for k, v in cached.items() if k != "time/sft"}
    if original is not None:
        metrics["sft/cached_original_time"] = original
    return {**metrics, "sft/cached": 1.0, "time/sft": took}
