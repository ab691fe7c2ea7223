"""Shared-prefix training versus the unshared packed forward, side by side in one run.

    .venv/bin/python scripts/bench_prefix.py                  # builtin:tiny on CPU
    .venv/bin/python scripts/bench_prefix.py --model builtin:small --reps 5

Three workloads of 8 prompts x 8 answers (G = 8):

* ``arith``: the built-in task's prompts as the trainer builds them (about 27 tokens) with 16-token answers;
* ``long``: 128-token prompts with 16-token answers (GSM8K-length prompts, short answers);
* ``multiturn``: a 48-token system prompt shared by every row, a 32-token first user turn per
  group, then per row a 16-token answer, a 24-token environment reply and a 16-token answer.

For each workload and mode (``unshared``: today's packed forward; ``shared``: the prefix tree) a
fresh subprocess measures tokens computed, the update's forward + backward (log-probs with entropy,
a policy-gradient loss, backward), the forward alone (no grad, as for behaviour / reference
log-probs), and the process's peak memory (max RSS on CPU, max allocated on CUDA). Then one whole
GRPO step of the trainer on the built-in task (generation with 16 new tokens, log-probs, update)
with sharing on (tree training and shared HF prefill) and off. Times are medians over ``--reps``.
The targets (CPU): update forward+backward >= 1.8x on ``arith`` and >= 3x on ``long``; the whole
GRPO step >= 1.5x on the built-in task.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS, G, ANSWER = 8, 8, 16
TARGETS = {("update", "arith"): 1.8, ("update", "long"): 3.0, ("step", "arith"): 1.5}


def workload_batch(name: str, tok, vocab: int):
    """``(input_ids, attention_mask, loss_mask)`` ``[B, S]`` of a workload, right-padded."""
    import torch

    g = torch.Generator().manual_seed(0)

    def rand(n):
        return torch.randint(6, vocab, (n,), generator=g).tolist()

    rows, masks = [], []
    if name == "arith":
        from areal_trainer.components import load_config
        from areal_trainer.data.datasets import build_samples
        from areal_trainer.rollout.workflows.single_turn import prompt_ids

        dataset = load_config("grpo", ["train_dataset.max_rows=64"]).train_dataset
        for sample in build_samples(dataset, tok, "train_dataset")[:PROMPTS]:  # the trainer's prompts
            prompt = prompt_ids(tok, sample["messages"])
            for _ in range(G):
                rows.append(prompt + rand(ANSWER))
                masks.append([0] * len(prompt) + [1] * ANSWER)
    elif name == "long":
        for _ in range(PROMPTS):
            prompt = rand(128)
            for _ in range(G):
                rows.append(prompt + rand(ANSWER))
                masks.append([0] * 128 + [1] * ANSWER)
    else:
        system = rand(48)
        for _ in range(PROMPTS):
            first = system + rand(32)
            for _ in range(G):
                rows.append(first + rand(16) + rand(24) + rand(16))
                masks.append([0] * 80 + [1] * 16 + [0] * 24 + [1] * 16)
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    am, lm = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, :len(r)], am[i, :len(r)], lm[i, :len(m)] = torch.tensor(r), 1, torch.tensor(m)
    return ids, am, lm


def peak_memory_mb(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_forward(workload: str, model_path: str, shared: bool, reps: int) -> dict:
    import torch

    from areal_trainer.model.load import load_causal_lm, load_tokenizer, resolve_device
    from areal_trainer.model.prefix import count_tree_tokens
    from areal_trainer.train.models.logprobs import forward_logprobs

    device = resolve_device("auto")
    tok = load_tokenizer(model_path if model_path.startswith("builtin:") else "builtin:tiny")
    model = load_causal_lm(model_path, tokenizer=tok, dtype="auto", device=device, seed=0)
    ids, am, lm = (t.to(device) for t in workload_batch(workload, tok, model.config.vocab_size))
    adv = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1)).to(device) * lm
    base = peak_memory_mb(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def update():
        logp, ent = forward_logprobs(model, ids, am, temperature=1.0, with_entropy=True, prefix_sharing=shared)
        (-(logp * adv).sum() / lm.sum()).backward()

    def forward():
        with torch.no_grad():
            forward_logprobs(model, ids, am, temperature=1.0, prefix_sharing=shared)

    times = {}
    for name, fn in (("update", update), ("forward", forward)):
        fn()  # warm-up
        runs = []
        for _ in range(reps):
            model.zero_grad(set_to_none=True)
            sync()
            t = time.perf_counter()
            fn()
            sync()
            runs.append(time.perf_counter() - t)
        times[name] = statistics.median(runs)
    computed = count_tree_tokens(ids, am) if shared else int(am.sum())
    return {"tokens": int(am.sum()), "computed": computed, **times, "peak_mb": peak_memory_mb(device),
            "base_mb": base}


def measure_step(model_path: str, shared: bool, reps: int, tmp: str) -> dict:
    from areal_trainer.components import load
    from areal_trainer.train.run import Trainer

    flag = str(shared).lower()
    overrides = [f"actor.path={model_path}", "sft_warmup.steps=0", "valid_dataset.max_rows=8",
                 f"train_dataset.batch_size={PROMPTS}", f"gconfig.n_samples={G}", f"gconfig.max_new_tokens={ANSWER}",
                 f"gconfig.min_new_tokens={ANSWER}", "stats_logger.progress_bar=false", f"total_train_steps={reps + 1}",
                 f"actor.enable_tree_training={flag}", "train_dataset.max_rows=2000"]
    if not model_path.startswith("builtin:"):
        overrides.append("tokenizer_path=builtin:tiny")
    trainer = Trainer(load("grpo", overrides), os.path.join(tmp, f"run-{flag}"))
    trainer.rollout.engine.share_prefill = shared
    trainer.prepare_models()
    ctx = trainer.step_context()
    rows = []
    for _ in range(reps + 1):
        _, m = trainer.step_once(ctx)
        rows.append({"generate": m["time/rollout"], "logprobs": m["time/logprobs"], "update": m["time/update"],
                     "step": m["time/step"], "computed": m["update/tokens_computed"], "tokens": m["update/tokens"]})
    timed = rows[1:]  # the first step warms up
    return {k: statistics.median(r[k] for r in timed) for k in timed[0]}


def child(args, what: list[str]) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *what, "--model", args.model, "--reps", str(args.reps)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(f"  {' '.join(what)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len("RESULT "):])


def verdict(kind: str, workload: str, ratio: float) -> str:
    target = TARGETS.get((kind, workload))
    return "" if target is None else f"  target >= {target}x: {'met' if ratio >= target else 'MISSED'}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="builtin:tiny")
    p.add_argument("--workloads", default="arith,long,multiturn")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-step", action="store_true", help="skip the whole-step comparison")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, *rest = args.child
        with tempfile.TemporaryDirectory(prefix="bench_prefix_") as tmp:
            res = (measure_forward(rest[0], args.model, rest[1] == "shared", args.reps) if kind == "forward"
                   else measure_step(args.model, rest[0] == "shared", args.reps, tmp))
        print("RESULT " + json.dumps(res))
        return
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(f"shared-prefix training, {args.model}, {PROMPTS} prompts x {G} answers, median of {args.reps}; {device}")
    head = f"{'workload':<10} {'mode':<9} {'tokens':>7} {'computed':>8} {'fwd+bwd':>9} {'forward':>9} {'peak MB':>8}"
    print(head)
    print("-" * len(head))
    for workload in args.workloads.split(","):
        res = {}
        for mode in ("unshared", "shared"):
            r = child(args, ["forward", workload, mode])
            if r is None:
                continue
            res[mode] = r
            print(f"{workload:<10} {mode:<9} {r['tokens']:>7} {r['computed']:>8} {r['update'] * 1e3:>7.1f}ms "
                  f"{r['forward'] * 1e3:>7.1f}ms {r['peak_mb']:>8.0f}", flush=True)
        if len(res) == 2:
            u, s = res["unshared"], res["shared"]
            ratio = u["update"] / s["update"]
            print(f"{workload:<10} {'ratio':<9} {'':>7} {u['computed'] / s['computed']:>7.2f}x {ratio:>8.2f}x "
                  f"{u['forward'] / s['forward']:>8.2f}x {u['peak_mb'] / s['peak_mb']:>7.2f}x"
                  f"{verdict('update', workload, ratio)}", flush=True)
    if args.no_step:
        return
    print(f"\none GRPO step on the built-in task ({ANSWER} new tokens), {args.model}")
    head = f"{'mode':<9} {'computed':>8} {'generate':>9} {'logprobs':>9} {'update':>8} {'step':>8}"
    print(head)
    print("-" * len(head))
    res = {}
    for mode in ("unshared", "shared"):
        r = child(args, ["step", mode])
        if r is None:
            continue
        res[mode] = r
        print(f"{mode:<9} {r['computed']:>8.0f} {r['generate']:>8.2f}s {r['logprobs']:>8.2f}s {r['update']:>7.2f}s "
              f"{r['step']:>7.2f}s", flush=True)
    if len(res) == 2:
        u, s = res["unshared"], res["shared"]
        ratio = u["step"] / s["step"]
        print(f"{'ratio':<9} {u['computed'] / s['computed']:>7.2f}x {u['generate'] / s['generate']:>8.2f}x "
              f"{u['logprobs'] / s['logprobs']:>8.2f}x {u['update'] / s['update']:>7.2f}x {ratio:>7.2f}x"
              f"{verdict('step', 'arith', ratio)}")


if __name__ == "__main__":
    main()
