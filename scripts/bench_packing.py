"""Benchmark training throughput with sequence packing against padded micro-batches.

One right-padded batch of ``--rows`` sequences whose lengths spread uniformly over ``--min-len ..
--max-len`` (default 16..160, a 10x spread) goes through the policy training forward and backward:
``forward_logprobs(..., with_entropy=True)`` and a token-mean loss ``-(adv * logp)``, then
``loss.backward()``. Variants (all in this one process, alternating, ``--reps`` times; medians):

* ``padded``: ``packing=False``, the ``[B, S]`` batch as it is;
* ``packed``: ``packing=None`` (auto: packs of the default width, see ``model/packing.py``);
* ``packed-N`` for each ``--widths N``: packing with ``max_pack_tokens=N`` (e.g. 8192 = one pack).

Throughput is real (non-padding) tokens per second of wall time. Before timing, the packed
log-probabilities and gradients are checked against the padded ones.

    .venv/bin/python scripts/bench_packing.py                   # builtin:small, 32 rows, 5 reps
    .venv/bin/python scripts/bench_packing.py --rows 8 --reps 1 --model builtin:tiny --widths 8192
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.model.packing import default_pack_tokens, pack_layout
from areal_trainer.train.models.logprobs import forward_logprobs

TARGET = 1.5
"""Target speed-up of packed over padded micro-batches on a batch whose lengths spread over 10x."""


def make_batch(n_rows: int, min_len: int, max_len: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n_rows,), generator=g)
    width = int(lengths.max())
    am = (torch.arange(width)[None] < lengths[:, None]).long()
    ids = torch.randint(6, vocab, (n_rows, width), generator=g) * am
    adv = torch.randn(n_rows, width, generator=g)
    return {"input_ids": ids, "attention_mask": am, "advantages": adv}


def train_step(model, batch: dict, packing: bool | None, width: int | None) -> torch.Tensor:
    """Forward + backward of the policy log-prob loss; returns the detached log-probs."""
    model.zero_grad(set_to_none=True)
    logp, _ = forward_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=1.0,
                               with_entropy=True, packing=packing, max_pack_tokens=width)
    mask = batch["attention_mask"].float()
    loss = -(batch["advantages"] * logp * mask).sum() / mask.sum()
    loss.backward()
    return logp.detach()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:small")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=160)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--widths", type=int, nargs="*", default=[], help="extra variants with max_pack_tokens=N")
    args = p.parse_args()

    tok = build_tokenizer()
    model = build_model(args.model, tok, seed=0)
    model.train()
    batch = make_batch(args.rows, args.min_len, args.max_len, len(tok))
    lengths = batch["attention_mask"].sum(1).tolist()
    n_real, n_padded = sum(lengths), batch["input_ids"].numel()
    variants: dict[str, tuple[bool | None, int | None]] = {"padded": (False, None), "packed": (None, None)}
    for w in args.widths:
        variants[f"packed-{w}"] = (True, w)

    # Agreement (and warm-up): packed vs padded log-probs and gradients.
    ref = train_step(model, batch, False, None)
    ref_grad = [q.grad.clone() for q in model.parameters()]
    lp = train_step(model, batch, None, None)
    d_lp = float((lp - ref).abs().max())
    d_grad = max(float((q.grad - g).abs().max()) for q, g in zip(model.parameters(), ref_grad))

    print(f"model={args.model} threads={torch.get_num_threads()} rows={args.rows} "
          f"lengths {args.min_len}..{args.max_len} (longest {max(lengths)}): real tokens {n_real}, "
          f"padded {n_padded} ({n_padded / n_real:.2f}x)")
    for name, (_, w) in variants.items():
        if name != "padded":
            shape = pack_layout(lengths, w or default_pack_tokens(lengths, False)).shape
            print(f"  {name}: pack grid {shape[0]} x {shape[1]} = {shape[0] * shape[1]} slots")
    print(f"agreement packed vs padded: max|dlogp|={d_lp:.1e} max|dgrad|={d_grad:.1e}")

    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            packing, width = variants[name]
            t0 = time.perf_counter()
            train_step(model, batch, packing, width)
            times[name].append(time.perf_counter() - t0)
        print(f"  rep {rep}: " + "  ".join(f"{n} {times[n][-1]:.2f}s" for n in names), flush=True)

    base = statistics.median(times["padded"])
    print(f"{'variant':>14} | {'median s':>8} | {'tokens/s':>8} | speed-up vs padded")
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:>14} | {med:>8.2f} | {n_real / med:>8.0f} | {base / med:.2f}x")
    speedup = base / statistics.median(times["packed"])
    print(f"target: packed (default) >= {TARGET}x the padded tokens/s: {speedup:.2f}x, "
          f"{'met' if speedup >= TARGET else 'MISSED'}")


if __name__ == "__main__":
    main()
