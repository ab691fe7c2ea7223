"""Benchmark the chunked log-probability + entropy head against the straightforward full softmax.

Both variants start from the same hidden states ``h [N, H]`` (requires grad), head weight
``W [V, H]`` (requires grad) and labels, compute per-token log-probabilities at temperature T and
the (detached) entropy, and run forward + backward of ``sum(w * logp)`` with random per-token
weights ``w`` (as a policy loss does):

* ``chunked``: ``areal_trainer.train.models.logprobs.chunked_logprobs`` (``[chunk, V]`` buffers, logits
  recomputed in backward);
* ``full``: ``logits = h @ W.T; logp_all = log_softmax(logits.float() / T)``, gather, entropy
  from the full tensor (no grad), autograd backward.

Every measurement runs in a fresh subprocess (one variant each, after a small warm-up), variants
alternate and repeat, and medians are reported. Peak memory on CPU is the resident-set high-water
mark above the resident set just before the measured step (Linux ``/proc/self/clear_refs`` resets
``VmHWM``; it includes the ``[V, H]`` weight gradient both variants create); on CUDA it is
``torch.cuda.max_memory_allocated`` above the allocation before the step. A small case first
checks that both variants agree (logp, entropy, gradients).

    .venv/bin/python scripts/bench_logprobs.py                       # V in 32000 151936, N=4096, H=896
    .venv/bin/python scripts/bench_logprobs.py --vocab 32000 --reps 1 --tokens 1024
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from areal_trainer.train.models.logprobs import chunked_logprobs, default_chunk_size

TEMPERATURE = 0.8


def inputs(n_tok: int, hidden: int, vocab: int, device: str, seed: int = 0, masked: float = 0.0):
    """``h [N, H]``, ``W [V, H]`` (both require grad), labels ``[N]`` and per-token loss weights ``[N]``,
    a fraction ``masked`` of them exactly 0 (tokens outside the loss mask)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n_tok, hidden, generator=g).to(device).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) * hidden ** -0.5).to(device).requires_grad_()
    labels = torch.randint(0, vocab, (n_tok,), generator=g).to(device)
    coef = torch.randn(n_tok, generator=g) * (torch.rand(n_tok, generator=g) >= masked)
    return h, w, labels, coef.to(device)


def step_chunked(h, w, labels, coef, chunk_size):
    logp, ent = chunked_logprobs(h, w, None, labels, temperature=TEMPERATURE, with_entropy=True,
                                 chunk_size=chunk_size)
    (coef * logp).sum().backward()
    return logp.detach(), ent


def step_full(h, w, labels, coef, chunk_size=None):
    logits = h @ w.T
    logp_all = torch.log_softmax(logits.float() / TEMPERATURE, -1)
    logp = logp_all.gather(-1, labels[:, None]).squeeze(-1)
    with torch.no_grad():
        ent = -(logp_all.exp() * logp_all).sum(-1)
    (coef * logp).sum().backward()
    return logp.detach(), ent


STEPS = {"chunked": step_chunked, "full": step_full}


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def worker(args) -> dict:
    """One measured step of one variant in this (fresh) process; returns peak MiB and seconds."""
    step = STEPS[args.variant]
    cuda = args.device == "cuda"
    small = inputs(64, args.hidden, 1024, args.device)
    step(*small, args.chunk_size)  # warm-up: thread pools, kernels
    del small
    h, w, labels, coef = inputs(args.tokens, args.hidden, args.vocab, args.device, masked=args.masked)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        base = _status_kb("VmRSS") * 1024
    t0 = time.perf_counter()
    step(h, w, labels, coef, args.chunk_size)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if cuda else _status_kb("VmHWM") * 1024
    return {"peak_mib": (peak - base) / 2**20, "seconds": seconds}


MEM_TARGET, TIME_TARGET = 0.25, 1.2
"""The targets: peak memory and time of the chunked path relative to the full softmax."""


def check(device: str, chunk_size: int, masked: float) -> tuple[float, float, float]:
    """Max |difference| of logp, entropy and (h, W) gradients between the variants on a small case."""
    out = []
    for step in (step_chunked, step_full):
        h, w, labels, coef = inputs(300, 64, 5000, device, seed=1, masked=masked)
        logp, ent = step(h, w, labels, coef, chunk_size)
        out.append((logp, ent, h.grad, w.grad))
    (a, b) = out
    grad = max(float((a[i] - b[i]).abs().max()) for i in (2, 3))
    return float((a[0] - b[0]).abs().max()), float((a[1] - b[1]).abs().max()), grad


def run_variant(args, variant: str, vocab: int, chunk_size: int, masked: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--variant", variant, "--vocab", str(vocab),
           "--tokens", str(args.tokens), "--hidden", str(args.hidden), "--device", args.device,
           "--chunk-size", str(chunk_size), "--masked", str(masked)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=0, help="0: default_chunk_size(V)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--masked", type=float, nargs="+", default=[0.0, 0.5],
                   help="fractions of tokens with zero loss weight, one case each (0 = dense)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=sorted(STEPS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.vocab, args.masked = args.vocab[0], args.masked[0]
        print(json.dumps(worker(args)))
        return

    print(f"device={args.device} threads={torch.get_num_threads()} N={args.tokens} H={args.hidden} "
          f"T={TEMPERATURE} reps={args.reps} (fresh process per measurement, medians)")
    for masked in args.masked:
        d_logp, d_ent, d_grad = check(args.device, 64, masked)
        print(f"agreement (N=300, V=5000, chunk 64, masked {masked:.0%}): max|dlogp|={d_logp:.1e} "
              f"max|dH|={d_ent:.1e} max|dgrad|={d_grad:.1e}")
    header = (f"{'V':>7} {'chunk':>5} {'masked':>6} | {'full MiB':>8} {'chunked MiB':>11} {'mem ratio':>9} | "
              f"{'full s':>7} {'chunked s':>9} {'time ratio':>10} | per-rep time ratios")
    print(header)
    print("-" * len(header))
    verdicts = []
    for vocab in args.vocab:
        chunk = args.chunk_size or default_chunk_size(vocab)
        for masked in args.masked:
            res: dict[str, list[dict]] = {"full": [], "chunked": []}
            for rep in range(args.reps):
                for variant in ("full", "chunked") if rep % 2 == 0 else ("chunked", "full"):
                    res[variant].append(run_variant(args, variant, vocab, chunk, masked))
            med = {v: {k: statistics.median(r[k] for r in rs) for k in ("peak_mib", "seconds")}
                   for v, rs in res.items()}
            per_rep = " ".join(f"{c['seconds'] / f['seconds']:.2f}" for f, c in zip(res["full"], res["chunked"]))
            f, c = med["full"], med["chunked"]
            print(f"{vocab:>7} {chunk:>5} {masked:>6.0%} | {f['peak_mib']:>8.0f} {c['peak_mib']:>11.0f} "
                  f"{c['peak_mib'] / f['peak_mib']:>9.3f} | {f['seconds']:>7.2f} {c['seconds']:>9.2f} "
                  f"{c['seconds'] / f['seconds']:>10.2f} | {per_rep}", flush=True)
            verdicts.append(f"V={vocab} masked {masked:.0%}: memory {c['peak_mib'] / f['peak_mib']:.3f}x "
                            f"({'met' if c['peak_mib'] <= MEM_TARGET * f['peak_mib'] else 'MISSED'}), time "
                            f"{c['seconds'] / f['seconds']:.2f}x "
                            f"({'met' if c['seconds'] <= TIME_TARGET * f['seconds'] else 'MISSED'})")
    print(f"targets: chunked peak memory <= {MEM_TARGET}x and time <= {TIME_TARGET}x of the full softmax")
    for v in verdicts:
        print("  " + v)

if __name__ == "__main__":
    main()
