"""GPU throughput check: a few GRPO steps of a Qwen2.5-shaped model with random weights (no download)
through the real trainer, with the HF rollout backend, synchronously and asynchronously
(``rollout.max_head_offpolicyness`` = each of ``--etas``); writes tokens/s, step time, peak memory and
the model-FLOPs utilisation (MFU) of the update per setting, and the asynchronous/synchronous
steps-per-second ratio, to a JSON file and prints it. The synchronous setting also runs with
shared-prefix training off (``--no-unshared`` skips it): ``shared_vs_unshared`` holds the time ratios
(> 1: sharing faster) and each setting its real and computed update tokens.

    python scripts/gpu_check.py --shape qwen2.5-1.5b --steps 4 --out gpu_check.json
    python scripts/gpu_check.py --shape qwen2.5-1.5b --steps 4 --lora --out gpu_check_lora.json
    python scripts/gpu_check.py --shape tiny --steps 2 --out /tmp/check.json     # CPU smoke of this script
    python scripts/gpu_check.py --backend vllm:d1p1t1 --weight-update-mode xccl   # on an inference server

Each setting also records the trainer's own telemetry: ``gen_tokens_per_s``, ``train_tokens_per_s``, ``tflops``,
``mfu`` (``perf/*``), ``weight_update_s`` and the step's time split.

MFU = 6 * parameters * trained tokens / update time / peak dense bf16 FLOP/s (attention FLOPs
ignored, so it is a slight underestimate). Any error exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocab (Qwen2.5 model cards' configs)
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936),
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=2048),
}


def make_model_dir(shape: str, path: str) -> int:
    """Write a random-weight Qwen2 model and a matching word-level tokenizer; returns the parameter count."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from areal_trainer.model.builtin import CHAT_TEMPLATE, SPECIALS, build_tokenizer

    dims = SHAPES[shape]
    base = build_tokenizer()  # the built-in task's vocabulary, padded with filler tokens to the model's size
    vocab = dict(base.get_vocab())
    for i in range(len(vocab), dims["vocab_size"]):
        vocab[f"<extra_{i}>"] = i
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = base.backend_tokenizer.pre_tokenizer
    tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", additional_special_tokens=SPECIALS[4:])
    tok.chat_template = CHAT_TEMPLATE
    cfg = Qwen2Config(**dims, max_position_embeddings=4096, tie_word_embeddings=shape != "qwen2.5-1.5b",
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def peak_flops() -> float | None:
    """The device's peak dense bf16 FLOP/s, from the table the trainer's ``perf/mfu`` uses."""
    from areal_trainer.train.perf import peak_tflops

    tflops = peak_tflops(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    return tflops * 1e12 if tflops else None


def run_setting(args, eta: int, model_dir: str, n_params: int, tmp: str, shared: bool = True) -> dict:
    """One run of the trainer with ``rollout.max_head_offpolicyness=eta`` (``shared``: shared-prefix
    training and prefill, the default, or both off); its steady-state numbers."""
    from areal_trainer.components import load
    from areal_trainer.tracking.logger import read_metrics
    from areal_trainer.train.loop import run

    components = load("grpo", [
        f"actor.path={model_dir}", f"total_train_steps={args.steps}", f"train_dataset.batch_size={args.prompts}",
        f"gconfig.n_samples={args.samples}", f"gconfig.max_new_tokens={args.max_new_tokens}",
        "gconfig.min_new_tokens=" + str(args.max_new_tokens // 2),  # random weights: keep answers long
        "sft_warmup.steps=0", "valid_dataset=null", "evaluator.eval_before_train=false", "evaluator.freq_steps=null",
        "saver.freq_steps=null", "stats_logger.plot=false", "stats_logger.progress_bar=false",
        "actor.gradient_checkpointing=true", "actor.optimizer.lr=1e-6", f"cluster.fileroot={tmp}",
        f"rollout.max_head_offpolicyness={eta}", *([] if shared else ["actor.enable_tree_training=false"]),
        f"rollout.backend={args.backend}", f"actor.weight_update_mode={args.weight_update_mode}",
        *(["actor.use_lora=true", "actor.optimizer.lr=1e-5"] if args.lora else []),
    ])
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    run_dir = os.path.join(tmp, f"run-eta{eta}-{'shared' if shared else 'unshared'}")
    run(components, run_dir=run_dir)
    records = [r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if "time/step" in r]
    steady = records[1:] or records  # the first step includes CUDA/kernels warm-up (asynchronous: the pipeline fills)
    mean = lambda k: sum(r.get(k, 0.0) for r in steady) / len(steady)  # noqa: E731
    trained_tokens = mean("actor/n_valid_tokens")
    seq_tokens = mean("rollout/seq_len") * mean("rollout/rows")
    flops = peak_flops()
    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "steps": len(records),
        "step_time_s": mean("time/step"), "rollout_time_s": mean("time/rollout"),
        "logprob_time_s": mean("time/logprobs"),
        "update_time_s": mean("time/update"), "tokens_per_s": mean("perf/tokens_per_s"),
        "generated_tokens_per_s": trained_tokens / max(mean("time/rollout"), 1e-9),
        "update_tokens_per_s": seq_tokens / mean("time/update"),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "update_mfu": (6 * n_params * seq_tokens / mean("time/update") / flops) if flops else None,
        "overlap_frac": mean("rollout/overlap_frac"), "trainer_idle_frac": mean("rollout/trainer_idle_frac"),
        "max_staleness": max(r.get("actor/staleness/max", 0.0) for r in records),
        "update_tokens": mean("update/tokens"), "update_tokens_computed": mean("update/tokens_computed"),
        # the trainer's own telemetry (docs/metrics.md, "Time and throughput")
        "gen_tokens_per_s": mean("perf/gen_tokens_per_s"), "train_tokens_per_s": mean("perf/train_tokens_per_s"),
        "tflops": mean("perf/tflops"), "mfu": mean("perf/mfu") if flops else None,
        "weight_update_s": mean("perf/weight_update_s") or mean("time/weight_push"),
        "time_split_s": {k: mean(f"time/{k}") for k in ("rollout", "generation", "rollout_wait", "logprobs",
                                                        "advantage", "update", "weight_push")},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--etas", default="0,2", help="max_head_offpolicyness settings to run; 0 is synchronous")
    ap.add_argument("--unshared", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the synchronous setting with shared-prefix training off, and compare")
    ap.add_argument("--lora", action="store_true", help="train LoRA adapters (actor.use_lora=true) in every setting")
    ap.add_argument("--backend", default="hf",
                    help="rollout.backend: hf (in process), or inference servers, e.g. vllm:d1p1t1 or hf:d1p1t1")
    ap.add_argument("--weight-update-mode", default="disk", choices=("disk", "xccl"),
                    help="actor.weight_update_mode with a server backend")
    ap.add_argument("--out", default="gpu_check.json")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        n_params = make_model_dir(args.shape, model_dir)
        runs = {eta: run_setting(args, eta, model_dir, n_params, tmp) for eta in map(int, args.etas.split(","))}
        unshared = run_setting(args, 0, model_dir, n_params, tmp, shared=False) if args.unshared else None
    first = next(iter(runs.values()))
    result = {"date": time.strftime("%Y-%m-%d"), "device": first["device"], "shape": args.shape, "parameters": n_params,
              "backend": args.backend, "weight_update_mode": args.weight_update_mode,
              "lora": args.lora, "prompts": args.prompts, "samples": args.samples,
              "max_new_tokens": args.max_new_tokens,
              **{k: v for k, v in first.items() if k != "device"},  # the first setting (synchronous by default)
              "settings": runs, "wall_s": time.time() - t0}
    if unshared is not None:  # the synchronous setting with every row computed in full
        result["unshared_sync"] = unshared
        result["shared_vs_unshared"] = {k: unshared[k] / runs[0][k] for k in ("step_time_s", "update_time_s",
                                        "logprob_time_s", "rollout_time_s") if 0 in runs and runs[0][k]}
    if 0 in runs:
        result["steps_per_s_vs_sync"] = {eta: r["step_time_s"] and runs[0]["step_time_s"] / r["step_time_s"]
                                         for eta, r in runs.items()}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
