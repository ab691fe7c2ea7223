"""Supervised warm start: a few hundred steps of teacher forcing on the training set's
demonstrations (the reference answers, unless the dataset provides separate demonstrations), so
that a randomly initialised built-in model learns the answer format before RL.

The loss is the mean negative log-likelihood of the answer tokens (the prompt is not trained on).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ..config.schema import SFTWarmupConfig
from ..data.datasets import demonstration
from ..rollout.batch import make_row, stack_rows
from ..rollout.workflow import prompt_ids
from .logprobs import forward_logprobs
from .optim import lr_factor


def sft_batch(samples: list[dict], tokenizer) -> dict[str, torch.Tensor]:
    """Prompt + reference answer + EOS rows; ``loss_mask`` marks the answer tokens."""
    rows = []
    for s in samples:
        answer = tokenizer(demonstration(s), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append(make_row([(prompt_ids(tokenizer, s["messages"]), False, None, -1),
                              (answer, True, [0.0] * len(answer), 0)], version=0))
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
