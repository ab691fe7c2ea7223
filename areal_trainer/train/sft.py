"""Supervised warm start: a few hundred steps of teacher forcing on the training set's
demonstrations (the reference answers, unless the dataset provides separate demonstrations), so
that a randomly initialised built-in model learns the answer format before RL.

The loss is the mean negative log-likelihood of the answer tokens (the prompt is not trained on).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import torch
from tqdm.auto import tqdm

from .. import faults
from ..config.schema import SFTWarmupConfig
from ..data.datasets import demonstration
from ..errors import UserError
from ..model.builtin import is_builtin
from ..model.chat import prompt_ids
from ..rollout.batch import make_row, stack_rows
from ..rollout.types import Segment
from . import manifest
from .logprobs import forward_logprobs
from .optim import lr_factor

DEFAULT_SFT_STEPS = 300
"""Warm-start steps for built-in (randomly initialised) models when ``sft_warmup.steps`` is null."""


def sft_batch(samples: list[dict], tokenizer) -> dict[str, torch.Tensor]:
    """Prompt + reference answer + EOS rows; ``loss_mask`` marks the answer tokens."""
    rows = []
    for s in samples:
        target = demonstration(s)
        if not isinstance(target, str):
            raise UserError(f"sft_warmup: {s['row']} has no reference answer to imitate (train_dataset.answer_key, or a "
                            "'demonstration' column); set sft_warmup.steps=0 for data without answers.")
        answer = tokenizer(target, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append(make_row([Segment(prompt_ids(tokenizer, s["messages"])),
                              Segment(answer, True, [0.0] * len(answer), [0] * len(answer), 0)]))
    return stack_rows(rows)


def sft_warmup(model, tokenizer, samples: list[dict], cfg: SFTWarmupConfig, *, steps: int, seed: int,
               device: torch.device, autocast_dtype=None, progress: bool = True) -> list[float]:
    """Train ``model`` in place for ``steps`` steps; returns the loss of every step."""
    from ..config.parts import OptimizerConfig

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    sched_cfg = OptimizerConfig(lr=cfg.lr, lr_scheduler_type="cosine", min_lr_ratio=0.1,
                                warmup_steps_proportion=min(1.0, cfg.warmup_steps / max(steps, 1)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, sched_cfg))
    gen = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    bar = tqdm(range(steps), desc="SFT warm start", disable=not progress, dynamic_ncols=True)
    for _ in bar:
        idx = torch.randint(len(samples), (cfg.batch_size,), generator=gen).tolist()
        batch = {k: v.to(device) for k, v in sft_batch([samples[i] for i in idx], tokenizer).items()}
        logp, _ = forward_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=1.0,
                                   autocast_dtype=autocast_dtype)
        mask = torch.roll(batch["loss_mask"], -1, dims=1)  # position t predicts token t+1
        mask[:, -1] = 0
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def cache_root() -> str:
    return os.environ.get("AREAL_TRAINER_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "areal_trainer"))


def warmstart_key(parts: dict) -> str:
    """A key for the warm-start cache: the settings plus the source of every module that shapes the
    result (the task generator, the built-in model and tokenizer, the training forward, this file),
    so edits invalidate it."""
    from ..data import arith
    from ..model import builtin, packing
    from . import logprobs

    h = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for path in (arith.__file__, builtin.__file__, builtin.VOCAB_FILE, logprobs.__file__, packing.__file__, __file__):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(torch.__version__.encode())
    return h.hexdigest()[:24]


def load_cached(model, key: str) -> dict | None:
    """Load a cached warm start into ``model``; returns its recorded metrics, or None if absent. A damaged
    entry (its files differ from its manifest, or do not load) is removed with a warning: it is recomputed."""
    path = os.path.join(cache_root(), "warmstart", key)
    if not os.path.isfile(os.path.join(path, "metrics.json")):
        return None
    wrong = manifest.problem(path)
    if wrong is None:
        try:
            state = torch.load(os.path.join(path, "model.pt"), weights_only=True)
            with open(os.path.join(path, "metrics.json")) as f:
                metrics = json.load(f)
            model.load_state_dict(state)
            return metrics
        except (OSError, RuntimeError, ValueError, EOFError) as e:  # torch reports a bad file as any of these
            wrong = f"it does not load ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
    print(f"warning: the cached warm start {path} is damaged: {wrong}; removing it and computing the warm start "
          "again.", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    return None


def store_cached(model, key: str, metrics: dict) -> None:
    """Write the warm start atomically: the weights and a manifest, metrics.json last, then rename."""
    root = os.path.join(cache_root(), "warmstart")
    os.makedirs(root, exist_ok=True)
    tmp = os.path.join(root, f".tmp-{key}-{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
    manifest.write(tmp)
    faults.point("warmstart.before_marker")
    with open(os.path.join(tmp, "metrics.json"), "w") as f:
        json.dump(metrics, f)
    final = os.path.join(root, key)
    try:
        os.rename(tmp, final)
    except OSError:  # another process stored the same warm start first
        shutil.rmtree(tmp, ignore_errors=True)


def warm_start(model, tokenizer, samples: list[dict], cfg, *, device: torch.device, autocast_dtype=None) -> dict:
    """The warm start ``cfg`` (a ``TrainerConfig``) asks for, in place on ``model``, reusing an identical
    cached one for built-in models; returns its metrics for step 0 (empty when there is none)."""
    sft = cfg.sft_warmup
    steps = sft.steps if sft.steps is not None else (DEFAULT_SFT_STEPS if is_builtin(cfg.actor.path) else 0)
    if steps <= 0:
        return {}
    key = None
    t0 = time.time()
    if sft.cache and is_builtin(cfg.actor.path):
        key = warmstart_key({"actor": cfg.actor.path, "seed": cfg.seed, "steps": steps, "sft": sft,
                             "data": cfg.train_dataset, "device": device.type, "dtype": cfg.actor.dtype})
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
