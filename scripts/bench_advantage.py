"""Benchmark the default advantage computation against a per-step loop of the same recurrence.

Both sides run the same default pipeline on the same random batch (B rows, width S, a prompt,
generated turns separated by tool spans, random padding, truncation and critic values); only the
estimator differs: the vectorised token/turn GAE versus the straightforward loop of
``tests/advantage/reference.py``. Printed per case: the time of each full computation, their
ratio, and ``max |A_fast - A_loop| / max |A_loop|``.

    .venv/bin/python scripts/bench_advantage.py                 # B=64, S in 1024 8192 32768
    .venv/bin/python scripts/bench_advantage.py --sizes 1024 --rows 8
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from areal_trainer.advantage import AdvantageInputs, TemporalResult
from areal_trainer.advantage.gae import compute_gae_lambda
from areal_trainer.advantage.pipeline import Stage, run_default
from areal_trainer.components.advantage import bind_advantage
from areal_trainer.config import PPOActorConfig
from tests.advantage.reference import token_gae_loop, turn_gae_loop


def random_batch(n_rows: int, width: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 2, width + 1, (n_rows,), generator=g)
    lengths[: max(n_rows // 8, 1)] = width  # some rows fill the padded width
    pos = torch.arange(width)[None, :]
    attn = pos < lengths[:, None]
    prompt = torch.randint(16, 257, (n_rows, 1), generator=g)
    # Segments of ~64 tokens; about 70% are generated turns, the rest tool/user spans.
    starts = torch.rand(n_rows, width, generator=g) < 1 / 64
    starts[:, 0] = False
    seg = starts.long().cumsum(-1)
    generated = (torch.rand(n_rows, width, generator=g) < 0.7).gather(1, seg)
    loss_mask = generated & attn & (pos >= prompt)
    return {
        "input_ids": torch.zeros(n_rows, width, dtype=torch.long),
        "attention_mask": attn.long(),
        "loss_mask": loss_mask.long(),
        "logprobs": -torch.rand(n_rows, width, generator=g),
        "rewards": torch.randn(n_rows, generator=g),
        "values": torch.randn(n_rows, width, generator=g),
        "is_truncated": torch.rand(n_rows, generator=g) < 0.5,
        "turn_ids": torch.where(loss_mask, seg, -1).int(),
    }


def loop_estimator(inputs):
    """The built-in estimators' arithmetic with the per-step loop kernels."""
    turn = inputs.time_unit == "turn"
    lam = compute_gae_lambda(inputs.loss_mask, inputs.turn_ids, time_unit=inputs.time_unit,
                             gae_lambda=inputs.gae_lambda, kwargs=inputs.gae_lambda_kwargs)
    boot = inputs.bootstrap_values * inputs.is_truncated
    task = inputs.outcome_rewards + inputs.process_rewards
    if turn:
        adv, ret = turn_gae_loop(task, inputs.values, inputs.loss_mask, inputs.turn_ids, boot,
                                 discount=inputs.discount, gae_lambda=lam)
        adv = adv + inputs.kl_rewards
    else:
        adv, ret = token_gae_loop(task + inputs.kl_rewards, inputs.values, inputs.loss_mask, boot,
                                  discount=inputs.discount, gae_lambda=lam)
    return TemporalResult(advantages=adv.float(), returns=ret.float(), total_rewards=task + inputs.kl_rewards)


def best_time(fn, reps: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 8192, 32768])
    ap.add_argument("--fast-reps", type=int, default=7, help="runs of the fast path; the best time counts")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B={args.rows}")
    print(f"{'S':>6} {'unit':>5} {'gamma/lam':>10} {'fast ms':>9} {'loop ms':>9} {'speed-up':>9} {'max|dA|/scale':>14}")
    for width in args.sizes:
        data = random_batch(args.rows, width, seed=width)
        for unit in ("token", "turn"):
            for gamma, lam in ((1.0, 1.0), (0.99, 0.95)):
                cfg = PPOActorConfig(kl_ctl=0.0, discount=gamma, gae_lambda=lam, gae_timestep_unit=unit)
                fast = bind_advantage(cfg)
                loop_stages = dataclasses.replace(fast.stages, estimator=Stage("loop", loop_estimator, builtin=False))
                inputs = AdvantageInputs(data, cfg)
                t_fast, a = best_time(lambda: fast(inputs), args.fast_reps)  # noqa: B023
                # the loop is timed once at the large sizes (seconds per run)
                t_loop, b = best_time(lambda: run_default(inputs, loop_stages), 1 if width >= 8192 else 3)  # noqa: B023
                scale = b.advantages.abs().max().item()
                diff = (a.advantages - b.advantages).abs().max().item() / max(scale, 1e-12)
                print(f"{width:>6} {unit:>5} {gamma:>4}/{lam:<5} {t_fast * 1e3:>9.1f} {t_loop * 1e3:>9.0f} "
                      f"{t_loop / t_fast:>8.0f}x {diff:>14.1e}")


if __name__ == "__main__":
    main()
