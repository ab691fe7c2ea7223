"""Agents whose tools take wall-clock time, side by side in one run: every tool call of an episode
waits ``--latency`` seconds (``asyncio.sleep``, as a sandbox or a search request does), after each of
the episode's ``--calls`` model calls (``examples/agents/bench_agent.py``).

(a) Episodes one at a time against all at once: ``AgentWorkflow.rollout`` on the same samples with
    ``max_concurrent=1`` (sequential) and unbounded (every episode of the call in flight, their model
    calls batched), on ``builtin:tiny`` with random weights; episodes/s and the ratio (target: >= 4x
    at 0.2 s latency). ``latency floor``: the time the tools alone take (sequential: every call's wait
    in turn; concurrent: one episode's waits).

(b) Training through the real command line, synchronous (``rollout.max_head_offpolicyness=0``) against
    eta = 1 and 2 (``offpolicy_mode=concurrent``: a rollout thread samples the next steps' episodes
    while the trainer trains), a few steps each in a fresh process with the same agent; steps/s and the
    ratio to synchronous (target: eta=2 >= 1.3x), the step's parts, the trainer's idle share (synchronous:
    the rollout's share of the step; asynchronous: ``rollout/trainer_idle_frac``), the largest
    ``rollout/oldest_version_lag`` and the largest version lag of a trained token
    (``actor/staleness/max``). Medians over the steps after the first ``--b-warmup`` (other work on a
    shared machine lengthens single steps). Random weights, no warm start (``sft_warmup.steps=0``) and
    ``min_new_tokens = max_new_tokens``: every answer has the same length, so every setting does the
    same work. The rollout thread admits groups once per rollout call, and a call of agent episodes lasts
    as long as its slowest episode; so with an agent, a call takes by default every group the staleness
    bound admits (``rollout.max_concurrent_rollouts`` = (eta + 1) x the batch), paying the tools' latency
    once for several steps. ``eta=2 narrow`` (``--wide 1``) limits a call to one step's groups
    (``rollout.max_concurrent_rollouts`` = the batch) to show the difference.

(c) One agent in its two forms: the calculator agent written against the ``openai`` package
    (``examples/agents/calculator/openai_agent.py``) on its example's config (``builtin:tiny-tools`` after the
    example's warm start, cached after the first run; its first 2,000 training rows, as (b), so that each start
    checks 2,000 prompts' lengths, not 50,000), in process (``run(data, *, client)``) and over the
    run's HTTP endpoint (``run(data, *, base_url, api_key)``): ``HTTPAgent`` builds one ``openai.AsyncOpenAI``
    on aiohttp and gives each episode its key with ``with_options`` (what docs/agents_http.md recommends),
    on the trainer's event loop and in two agent processes (``rollout.agent_processes=2``); ``HTTPxAgent`` is
    the same on the package's default transport (httpx), ``run_new_client`` builds a new client in every
    episode, ``JSONAgent`` posts the same requests as JSON with aiohttp, without the package (what the
    endpoint itself costs). Synchronous training through the real command line, one run after the other;
    seconds per step and per rollout, and the ratio to in-process (target: <= 1.3x per step for the client
    built once, in agent processes). The forms sample the same rows from the same seed (the script checks
    it), so the difference is what the HTTP path costs.

    .venv/bin/python scripts/bench_agents.py                        # 0.2 s per tool call, 3 calls per episode
    .venv/bin/python scripts/bench_agents.py --latency 0.5 --calls 2
    .venv/bin/python scripts/bench_agents.py --quick                # a smoke run (well under a minute)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

AGENT = "examples.agents.bench_agent.BenchAgent"
HTTP_TARGET = 1.3
"""(c): the HTTP form's seconds per step at most this many times the in-process form's."""
CONCURRENT_TARGET = 4.0
"""(a): concurrent episodes/s at least this many times the sequential episodes/s (0.2 s latency)."""
ETA_TARGET = 1.3
"""(b): eta=2 at least this many times the synchronous steps/s."""
DEFAULTS = dict(
    a_prompts=8, a_samples=4, a_new=8,
    b_model="builtin:tiny", b_prompts=8, b_samples=8, b_new=8, b_steps=12, b_warmup=2, etas="1,2", wide=1,
    c_prompts=8, c_samples=8, c_steps=10, c_warmup=2, c_sft=600, c_model="builtin:tiny-tools",
)
QUICK = dict(
    a_prompts=2, a_samples=2, a_new=4,
    b_model="builtin:tiny", b_prompts=2, b_samples=2, b_new=4, b_steps=1, b_warmup=1, etas="2", wide=0,
    c_prompts=2, c_samples=2, c_steps=1, c_warmup=1, c_sft=10, c_model="builtin:tiny-tools",
)
HELP = {"etas": "; eta values of (b) beside the synchronous run",
        "wide": "; 1: add a run of the largest eta whose rollout calls take only one step's groups",
        "c_sft": "; warm-start steps of (c) (the calculator example's own: 600)",
        "c_model": "; the model of (c): builtin:tiny-tools (the example's) or builtin:small-tools (10M)"}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# -- (a) one rollout call, in this process ---------------------------------------------------------
def arith_samples(n: int) -> list[dict]:
    from areal_trainer.data import arith

    return [{"messages": [{"role": "user", "content": r["question"]}], "prompt": r["question"],
             "answer": r["answer"], "fields": {}} for r in arith.generate("train", n)]


def rollout_call(engine, tok, samples, gconfig, *, calls: int, latency: float, max_concurrent: int | None):
    """Wall seconds of one ``AgentWorkflow.rollout`` call, and its engine calls."""
    from areal_trainer.rollout.agents.spec import load_agent
    from areal_trainer.rollout.agents.workflow import AgentWorkflow

    spec = load_agent(AGENT, {"calls": calls, "latency": latency})
    reward = types.SimpleNamespace(error_value=0.0, max_error_fraction=0.0)  # any failed episode stops the run
    wf = AgentWorkflow(engine=engine, tokenizer=tok, reward=reward, agent=spec, max_concurrent=max_concurrent)
    t0 = time.perf_counter()
    groups = wf.rollout(samples, gconfig)
    seconds = time.perf_counter() - t0
    episodes = sum(len(g.episode_rows or ()) for g in groups)
    if episodes != len(samples) * gconfig.n_samples:
        raise SystemExit(f"(a): {episodes} of {len(samples) * gconfig.n_samples} episodes made calls")
    return seconds, wf.batch_calls


def part_a(s: dict, args) -> float:
    import torch

    from areal_trainer.config.schema import GenerationHyperparameters
    from areal_trainer.model.builtin import build_model, build_tokenizer
    from areal_trainer.rollout.engines.hf import HFEngine

    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0).eval()
    engine = HFEngine(model, tok, device=torch.device("cpu"))
    g = GenerationHyperparameters(n_samples=s["a_samples"], max_new_tokens=s["a_new"], min_new_tokens=s["a_new"])
    samples = arith_samples(s["a_prompts"])
    episodes = s["a_prompts"] * s["a_samples"]
    print(f"(a) one rollout call: {s['a_prompts']} prompts x {s['a_samples']} episodes = {episodes} episodes, "
          f"{args.calls} calls each, {args.latency:.2f} s per tool call, builtin:tiny, {s['a_new']} new tokens "
          "per call")
    torch.manual_seed(0)
    rollout_call(engine, tok, samples, g, calls=1, latency=0.0, max_concurrent=None)  # warm-up, not timed
    head = f"  {'episodes':<11} | {'in flight':>9} | {'seconds':>7} | {'episodes/s':>10} | {'engine calls':>12} | " \
           f"{'rows/call':>9} | {'latency floor':>13}"
    print(head)
    print("  " + "-" * (len(head) - 2))
    rate = {}
    for name, limit in (("sequential", 1), ("concurrent", None)):
        torch.manual_seed(0)
        seconds, calls = rollout_call(engine, tok, samples, g, calls=args.calls, latency=args.latency,
                                      max_concurrent=limit)
        floor = args.calls * args.latency * (episodes if limit == 1 else 1)
        rate[name] = episodes / seconds
        print(f"  {name:<11} | {limit or episodes:>9} | {seconds:>7.2f} | {rate[name]:>10.2f} | {calls:>12} | "
              f"{episodes * args.calls / calls:>9.1f} | {floor:>11.2f} s", flush=True)
    ratio = rate["concurrent"] / rate["sequential"]
    verdict = "met" if ratio >= CONCURRENT_TARGET else "MISSED"
    print(f"  concurrent / sequential: {ratio:.2f}x episodes/s (target >= {CONCURRENT_TARGET:g}x at 0.2 s: {verdict})")
    return ratio


# -- (b) training through the command line ---------------------------------------------------------
def settings(s: dict) -> list[tuple[str, int, list[str]]]:
    """(name, eta, extra overrides) of every run of (b): synchronous first."""
    out = [("sync", 0, [])] + [(f"eta={e}", e, []) for e in (int(x) for x in s["etas"].split(",") if x.strip())]
    eta = max(e for _, e, _ in out)
    if s["wide"] and eta > 0:
        out.append((f"eta={eta} narrow", eta,
                    [f"rollout.max_concurrent_rollouts={s['b_prompts']}"]))
    return out


def train_run(name: str, eta: int, extra: list[str], s: dict, args, tmp: str) -> dict:
    overrides = [
        "--config-name", "grpo", f"actor.path={s['b_model']}", "sft_warmup.steps=0", f"seed={args.seed}",
        f"total_train_steps={s['b_warmup'] + s['b_steps']}", f"train_dataset.batch_size={s['b_prompts']}",
        "train_dataset.max_rows=2000", f"gconfig.n_samples={s['b_samples']}", f"gconfig.max_new_tokens={s['b_new']}",
        f"gconfig.min_new_tokens={s['b_new']}", f"rollout.agent={AGENT}",
        f"+rollout.agent_kwargs={{calls: {args.calls}, latency: {args.latency}}}",
        f"rollout.max_head_offpolicyness={eta}", "rollout.offpolicy_mode=concurrent", *QUIET, *extra, *args.overrides]
    return cli_run(name, eta, overrides, s["b_warmup"], tmp, "(b)")


QUIET = ["valid_dataset=null", "evaluator.freq_steps=null", "evaluator.eval_before_train=false",
         "saver.freq_steps=null", "stats_logger.progress_bar=false", "stats_logger.plot=false"]


def cli_run(name: str, eta: int, overrides: list[str], warmup: int, tmp: str, part: str) -> dict:
    """One training run through the command line; the medians of its steps after the first ``warmup``."""
    run_dir = os.path.join(tmp, "".join(c if c.isalnum() else "-" for c in name))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "areal_trainer", *overrides, f"hydra.run.dir={run_dir}"], cwd=tmp,
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{part} {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if "time/step" in r]
    measured = steps[warmup:]

    def median(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in measured)

    step = median("time/step")
    out = {"name": name, "eta": eta, "steps_per_s": 1.0 / step, "step_s": step, "process_s": time.time() - t0,
           "rollout_s": median("time/rollout"), "steps": measured,
           "train": statistics.median(r["time/logprobs"] + r["time/update"] for r in measured)}
    if eta == 0:  # the trainer waits for the whole rollout
        out.update(wait=median("time/rollout"), idle=statistics.median(r["time/rollout"] / r["time/step"]
                                                                       for r in measured), oldest_lag=0.0)
    else:
        out.update(wait=median("time/rollout_wait"), idle=median("rollout/trainer_idle_frac"),
                   oldest_lag=max(r["rollout/oldest_version_lag"] for r in measured))
    out["token_lag"] = max(r.get("actor/staleness/max", 0.0) for r in measured)
    return out


def part_b(s: dict, args) -> float | None:
    runs = settings(s)
    print(f"\n(b) training, python -m areal_trainer: {s['b_model']} (random weights), {s['b_prompts']} prompts x "
          f"{s['b_samples']} episodes per step, {args.calls} calls each ({s['b_new']} new tokens), "
          f"{args.latency:.2f} s per tool call; medians of {s['b_steps']} steps after {s['b_warmup']}; overrides: "
          f"{' '.join(args.overrides) or '-'}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_agents_") as tmp:
        for name, eta, extra in runs:
            rows.append(train_run(name, eta, extra, s, args, tmp))
            print(f"  {name}: {rows[-1]['step_s']:.2f} s/step ({rows[-1]['process_s']:.0f} s in all)", flush=True)
    base = rows[0]
    head = f"  {'setting':<12} | {'steps/s':>7} | {'vs sync':>7} | {'s/step':>6} | {'rollout wait':>12} | " \
           f"{'train':>6} | {'trainer idle':>12} | {'oldest lag':>10} | {'token lag max':>13}"
    print(head)
    print("  " + "-" * (len(head) - 2))
    for r in rows:
        print(f"  {r['name']:<12} | {r['steps_per_s']:>7.3f} | {r['steps_per_s'] / base['steps_per_s']:>6.2f}x | "
              f"{r['step_s']:>6.2f} | {r['wait']:>10.2f} s | {r['train']:>4.2f} s | {r['idle']:>12.2f} | "
              f"{r['oldest_lag']:>10.0f} | {r['token_lag']:>13.0f}")
    print("  rollout wait: the trainer's wait for its batch (synchronous: the whole rollout); train: log-probs and "
          "update;\n  oldest lag: rollout/oldest_version_lag; token lag max: actor/staleness/max")
    if runs[-1][0].endswith(" narrow"):
        print(f"  {rows[-1]['name']}: rollout.max_concurrent_rollouts={runs[-1][2][0].split('=')[-1]}, so that a "
              "rollout call takes one step's groups, not every group the staleness bound admits (the default)")
    best = next((r for r in rows if r["name"] == "eta=2"), None)
    if best is None:
        return None
    if best["oldest_lag"] < 2:
        print(f"  eta=2 trained nothing older than {best['oldest_lag']:.0f} version(s): each rollout call admits "
              f"at most rollout.max_concurrent_rollouts groups and lasts as long as its slowest "
              f"episode ({args.calls} x {args.latency:g} s of tools plus generation), so the rollout thread, not eta, "
              "sets the pace")
    ratio = best["steps_per_s"] / base["steps_per_s"]
    print(f"  eta=2 / sync: {ratio:.2f}x steps/s (target >= {ETA_TARGET:g}x: "
          f"{'met' if ratio >= ETA_TARGET else 'MISSED'})")
    return ratio


_CALC = "examples.agents.calculator.openai_agent."
FORMS = (("in-process", _CALC + "run", []),
         ("HTTP", _CALC + "HTTPAgent", []),
         ("HTTP, 2 agent processes", _CALC + "HTTPAgent", ["rollout.agent_processes=2"]),
         ("HTTP, httpx transport", _CALC + "HTTPxAgent", []),
         ("HTTP, client per episode", _CALC + "run_new_client", []),
         ("HTTP, JSON without openai", _CALC + "JSONAgent", []))
"""(c): the calculator agent written against the ``openai`` package, in process and over HTTP: (name, agent, extra
overrides)."""


def part_c(s: dict, args) -> float:
    print(f"\n(c) one agent, two forms: the calculator agent of examples/agents/calculator/openai_agent.py on its "
          f"example's config ({s['c_model']} after its warm start, cached), {s['c_prompts']} prompts x "
          f"{s['c_samples']} episodes per step, synchronous; medians of {s['c_steps']} steps after {s['c_warmup']}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_agents_") as tmp:
        for name, agent, extra in FORMS:
            overrides = ["--config-dir", os.path.join(ROOT, "examples", "agents", "calculator"), "--config-name",
                         "calculator", f"seed={args.seed}", f"total_train_steps={s['c_warmup'] + s['c_steps']}",
                         f"train_dataset.batch_size={s['c_prompts']}", "train_dataset.max_rows=2000",
                         f"gconfig.n_samples={s['c_samples']}",
                         f"rollout.agent={agent}", f"sft_warmup.steps={s['c_sft']}", f"actor.path={s['c_model']}",
                         *extra, *QUIET, *args.overrides]
            rows.append(cli_run(name, 0, overrides, s["c_warmup"], tmp, "(c)"))
            print(f"  {name}: {rows[-1]['step_s']:.2f} s/step ({rows[-1]['process_s']:.0f} s in all)", flush=True)
    same = all(_sampled(r["steps"]) == _sampled(rows[0]["steps"]) for r in rows)
    head = f"  {'form':<25} | {'s/step':>6} | {'rollout s':>9} | {'train s':>7} | {'vs in-process':>13}"
    print(head)
    print("  " + "-" * (len(head) - 2))
    local = rows[0]
    for r in rows:
        print(f"  {r['name']:<25} | {r['step_s']:>6.2f} | {r['rollout_s']:>9.2f} | {r['train']:>7.2f} | "
              f"{r['step_s'] / local['step_s']:>12.2f}x")
    print(f"  the {len(rows)} runs sampled {'the same' if same else 'DIFFERENT'} rows (calls, tokens, rewards at every "
          "step)")
    http, procs, httpx, fresh, raw = rows[1:6]
    ratio = procs["step_s"] / local["step_s"]
    print(f"  HTTP in 2 agent processes / in-process: {ratio:.2f}x s/step, "
          f"{procs['rollout_s'] / local['rollout_s']:.2f}x s/rollout (target <= {HTTP_TARGET:g}x per step: "
          f"{'met' if ratio <= HTTP_TARGET else 'MISSED'}); on the trainer's loop: "
          f"{http['step_s'] / local['step_s']:.2f}x; on httpx: {httpx['step_s'] / local['step_s']:.2f}x; a new client "
          f"per episode: {fresh['step_s'] / local['step_s']:.2f}x s/step")
    print(f"  without the openai package (JSON posted with aiohttp): {raw['step_s'] / local['step_s']:.2f}x s/step: "
          "what the endpoint costs; the rest of the HTTP form's difference is the package's own work per request")
    return ratio


def _sampled(steps: list[dict]) -> list[tuple]:
    keys = ("agent/calls", "agent/tool_calls", "actor/n_valid_tokens", "reward/sampled")
    return [tuple(r.get(k) for k in keys) for r in steps]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency", type=float, default=0.2, help="seconds each tool call waits (default 0.2)")
    p.add_argument("--calls", type=int, default=3, help="model calls per episode, each followed by a tool call")
    p.add_argument("--quick", action="store_true", help="tiny sizes and 1 measured step: a smoke run")
    p.add_argument("--parts", default="a,b,c", help="which measurements to run (a comma-separated subset of a,b,c)")
    p.add_argument("--seed", type=int, default=1)
    for key, value in DEFAULTS.items():
        p.add_argument("--" + key.replace("_", "-"), type=type(value), default=None,
                       help=f"default {value} ({QUICK[key]} with --quick)" + (HELP.get(key, "")))
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run of (b) (after --)")
    args = p.parse_args()
    s = {k: getattr(args, k) if getattr(args, k) is not None else (QUICK if args.quick else DEFAULTS)[k]
         for k in DEFAULTS}
    import torch

    print(f"bench_agents {datetime.datetime.now().isoformat(timespec='seconds')}, commit {commit()}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads")
    print(f"settings: latency {args.latency:g} s, {args.calls} calls per episode, "
          f"{'quick' if args.quick else 'default'}"
          f" sizes: " + ", ".join(f"{k}={v}" for k, v in s.items()))
    if args.quick:
        print("quick sizes: a smoke run; the targets are for the default sizes")
    parts = set(args.parts.split(","))
    if "a" in parts:
        part_a(s, args)
    if "b" in parts:
        part_b(s, args)
    if "c" in parts:
        part_c(s, args)


if __name__ == "__main__":
    main()
