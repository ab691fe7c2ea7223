"""The training loop: set up (resume, or warm start), then every step: train, advance the policy
version, evaluate when due, log, save when due, show progress; at the end, the summary.

Each step's record goes to disk before its checkpoint: a checkpoint then always implies its step's
record, and a kill between the two only repeats that step on resume.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import warnings

from tqdm.auto import tqdm

from .. import faults, fsdp
from ..components import Components
from ..errors import UserError
from ..metrics import Mean, floats
from ..model.vision import image_names
from ..tracking import runlog
from ..tracking.console import ProgressPostfix
from ..tracking.health import HealthMonitor
from ..tracking.logger import NullLogger, StatsLogger, read_metrics
from ..tracking.plot import plot_run
from ..tracking.samples import eval_example, step_samples
from .evaluate import evaluate, finish, reverse_kl, unscorable
from .headline import headline, phase
from .run import Trainer, seed_everything
from .state import checkpoint as ckpt
from .state import divergence, manifest
from .state.resume import ResumePlan, plan_resume


def train(t: Trainer) -> dict[str, float]:
    cfg, dist, main = t.cfg, t.dist, t.dist.is_main
    if t.resume_from:
        t.prepare_models()
        t.restore()
        t.resumed_step = t.step
        t.start_norm = divergence.start_norm(t.resume_from)
        _check_unverified(t)
        faults.point("resume.after_restore")
        if t.step >= t.total_steps:  # e.g. total_train_epochs lowered: nothing left to do, nothing to rewrite
            if main:
                print(f"The run is already complete: {t.resume_from} is at step {t.step} of {t.total_steps}. "
                      "Nothing to do; raise total_train_steps or total_train_epochs to train further.", flush=True)
            return {}
        t.push_weights()
        if main:  # say where the run continues from before its first step
            print(f"resuming from {t.resume_from} (step {t.step} of {t.total_steps})", flush=True)
    log = StatsLogger(t.run_dir, cfg, resume_step=t.step if t.resume_from else None) if main else NullLogger()
    # On resume the bar starts from the latest accuracy in the metrics file (truncated to the checkpoint).
    metrics_file = os.path.join(t.run_dir, "metrics.jsonl")
    pure = t.components.distill is not None and t.components.distill.pure  # the bar shows the KL, not a reward
    postfix = ProgressPostfix(read_metrics(metrics_file) if t.resume_from and main and os.path.exists(metrics_file)
                              else None, live="kl" if pure else "reward")
    health = HealthMonitor(max_new_tokens=cfg.gconfig.max_new_tokens)
    if t.resume_from and main and os.path.exists(metrics_file):  # warned before the kill: not again
        for r in read_metrics(metrics_file):
            health.observe(r["step"], r)
    if not t.resume_from:
        start(t, log, postfix)
    if t.start_norm is None and main and (stats := _actor_stats(t)) is not None:
        t.start_norm = stats["norm"]  # after the warm start: where RL begins
    bar = tqdm(total=t.total_steps, initial=t.step, desc=f"{cfg.algorithm}", dynamic_ncols=True,
               disable=not (cfg.stats_logger.progress_bar and main))
    ctx, last = t.step_context(), {}
    last_eval = last_save = time.time()
    t.source.start()
    try:
        while t.step < t.total_steps:
            result, metrics = t.step_once(ctx)
            prompts = sorted(i for ids in dist.gather_objects(result.prompt_ids) for i in ids)
            if t.consecutive_skips >= cfg.actor.max_consecutive_nonfinite_steps:
                raise UserError(_nonfinite_stop(t))
            if _due(t, cfg.evaluator, last_eval) or t.step == t.total_steps:
                metrics.update(evaluate_policy(t))
                last_eval = time.time()
            log.log(t.step, metrics, extra={"data/prompt_ids": prompts})
            if main and result.batch is not None:  # only the main process writes samples.jsonl
                b, adv = result.batch, result.advantages
                log.log_samples(t.step, step_samples(t.tokenizer, b.rollout_data(), adv.advantages, adv.loss_mask,
                                                     b.group_sizes, cfg.stats_logger.samples_per_step, b.prompt_ids,
                                                     image_names(b.vision), t.image_token))
            # No checkpoint while updates are being skipped as non-finite (but at the end): the newest one
            # then stays the last good state to resume from.
            if (_due(t, cfg.saver, last_save) or _due(t, cfg.recover, last_save)) and (
                    not t.consecutive_skips or t.step == t.total_steps):
                t.save()
                last_save = time.time()
            last = metrics
            for warning in health.observe(t.step, metrics) if main else ():
                tqdm.write(warning)  # keeps a running progress bar intact
            shown = postfix(metrics)
            bar.set_postfix(shown)  # a dict, so the reward stays first
            bar.update(1)
            runlog.note(f"{cfg.algorithm} step {t.step}/{t.total_steps}: "
                        + ", ".join(f"{k} {v}" for k, v in shown.items()))  # the bar's state, once per step
    finally:
        t.source.close()
        close = getattr(t.rollout.engine, "close", None)  # e.g. the inference servers the run started
        if callable(close):
            close()
        for workflow in {id(w): w for w in (getattr(t.source, "workflow", None), t.eval_workflow)}.values():
            close = getattr(workflow, "close", None)  # e.g. an agent's HTTP endpoint
            if callable(close):
                close()
        bar.close()
        log.close()
    return summary(t, last) if main else {}


def start(t: Trainer, log, postfix: ProgressPostfix) -> None:
    """A fresh run: the warm start, then the models of RL, then (optionally) the evaluation before RL."""
    metrics = t.warm_start()
    if metrics:
        log.log(0, metrics)
    t.push_weights()
    t.prepare_models()
    if t.dist.enabled:  # identical initial weights everywhere; different samples per process
        seed_everything(t.cfg.seed + 10007 * t.dist.rank)
    before = evaluate_policy(t) if t.cfg.evaluator.eval_before_train else {}
    if before:  # none without a valid_dataset
        postfix.update(before)
        log.log(0, before)


def _due(t: Trainer, freq, last: float) -> bool:
    epoch_end = t.step % t.loader.steps_per_epoch == 0
    due = bool((freq.freq_steps and t.step % freq.freq_steps == 0)
               or (freq.freq_epochs and epoch_end and (t.step // t.loader.steps_per_epoch) % freq.freq_epochs == 0)
               or (freq.freq_secs and time.time() - last >= freq.freq_secs))
    return t.dist.any(due)  # clocks differ between processes; decide together


def evaluate_policy(t: Trainer) -> dict[str, float]:
    """Held-out evaluation of the current weights (each process its share of the prompts)."""
    if t.valid_samples is None:
        return {}
    t0 = time.time()
    mine = t.valid_samples[t.dist.rank::t.dist.world_size]
    examples: list = []
    problem = unscorable(t.teachers.spec, t.valid_samples) if t.teachers is not None else None
    if problem and t.dist.is_main:  # the same rows on every process: they all skip the teachers' collectives
        warnings.warn(f"no held-out reverse KL to the teacher (eval/distill/*): {problem}", UserWarning, stacklevel=1)
    groups: list | None = [] if t.teachers is not None and problem is None else None  # kept for the teachers
    with fsdp.gathered(t.policy.model):
        out = evaluate(t.eval_workflow, mine, t.cfg.eval_gconfig, t.components.valid_dataset.batch_size,
                       examples=examples, verifier=t.components.verifier,
                       turn_discount=t.components.rollout.turn_discount, keep=groups)
    if groups is not None:
        out.update(reverse_kl(t.policy, t.teachers, groups, samples=mine, step=t.step, device=t.device))
    out["time/eval"] = Mean(time.time() - t0)
    out = finish(floats(t.dist.reduce_metrics(out)))
    if t.dist.is_main and examples:  # tqdm.write keeps a running progress bar intact
        group, correct = examples[0]
        tqdm.write(eval_example(t.tokenizer, group, t.step, correct=correct if "eval/accuracy" in out else None,
                                images=(image_names(getattr(group, "vision", None) or ()) or [()])[0],
                                image_token=t.image_token))
    return out


def summary(t: Trainer, last: dict[str, float]) -> dict[str, float]:
    records = read_metrics(log_path := os.path.join(t.run_dir, "metrics.jsonl"))
    verifier, distill = t.components.verifier, t.components.distill
    if t.cfg.stats_logger.plot and records:
        plot_run(t.run_dir, title=f"{t.cfg.algorithm} / {t.cfg.experiment_name} / {t.cfg.trial_name}",
                 reward_label=verifier.what if verifier is not None else "reward",
                 distill=distill is not None and distill.pure)
    out = {"final_step": t.step, **{k: v for k, v in last.items() if k.startswith(("eval/", "reward/"))}}
    lines, numbers = headline(records, verifier, trains_by=phase(distill))
    out.update(numbers)
    for line in lines:
        print(line)
    print(f"run directory: {t.run_dir} (metrics: {log_path})")
    return out


class Terminated(SystemExit):
    """SIGTERM arrived: the run stops like after Ctrl-C (exit status 143)."""


@contextlib.contextmanager
def _sigterm_stops_cleanly():
    """SIGTERM raises :class:`Terminated` in the main thread, so the rollout thread is stopped and the
    files are closed on the way out (the newest complete checkpoint stays valid: checkpoints are
    renamed into place only once complete)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _actor_stats(t: Trainer) -> dict | None:
    """The actor's weight norm and finiteness, as a checkpoint records them; None for a sharded actor (its
    full weights exist only in a collective gather, which a save does)."""
    saved = t.policy.checkpoint_model()
    return None if fsdp.is_sharded(getattr(saved, "module", saved)) else ckpt.weight_stats(ckpt.model_state(saved))


def _check_unverified(t: Trainer) -> None:
    """A resumed checkpoint without a manifest (nothing checked its files): its loaded actor weights must be finite."""
    if os.path.isfile(os.path.join(t.resume_from, manifest.MANIFEST)) or (stats := _actor_stats(t)) is None:
        return
    if not stats["finite"]:
        raise UserError(f"{t.resume_from} has no {manifest.MANIFEST}, and its actor weights loaded with NaN or "
                        "infinite values: its files are damaged (or it diverged). Resume from an earlier checkpoint "
                        "(remove this one) or start a new run.")


def _nonfinite_stop(t: Trainer) -> str:
    """The message of a run stopped by non-finite steps: where to resume from, and whether the checkpoint
    the run resumed from is the likely cause (its recorded weights are not healthy, and every step since
    had a non-finite loss)."""
    head = (f"{t.consecutive_skips} consecutive optimizer steps had a non-finite loss or gradient norm; stopping at "
            f"step {t.step}.")
    checkpoints = ckpt.checkpoint_dirs(t.run_dir)
    judged = divergence.judged(checkpoints)
    suspect = {p for _, p, wrong in judged if wrong}  # blamed only on the evidence of their weights
    if t.resume_from in suspect and t.consecutive_skips >= t.step - t.resumed_step:
        return f"{head} {divergence.resumed_diverged(checkpoints, t.resume_from)}"
    if judged and judged[-1][2]:  # the newest checkpoint has diverged already: never advise resuming it
        _, newest, wrong = judged[-1]
        advice = divergence.how_to_resume_from(divergence.last_healthy(checkpoints, newest), checkpoints, newest)
        return f"{head} The newest checkpoint, {newest}, has diverged too: {wrong}. {advice}"
    found = checkpoints[-1][1] if checkpoints else None
    resume = (f"The newest checkpoint, {found}, was written before these steps; resume from it with a lower "
              "learning rate: recover.mode=auto actor.optimizer.lr=<lower> (a resume may change the learning "
              "rate)") if found else "No checkpoint was written yet; start again with a lower actor.optimizer.lr"
    return f"{head} {resume}, check the reward scale, or raise actor.max_consecutive_nonfinite_steps."


def run(components: Components, run_dir: str, resume: ResumePlan | None = None) -> dict[str, float]:
    """Train according to ``components`` (``components.build``), writing into ``run_dir``; returns a summary.
    ``resume``: where to resume from (``resume.plan_resume``; decided here when not given)."""
    plan = resume if resume is not None else plan_resume(run_dir, components.config)
    with _sigterm_stops_cleanly():
        trainer = Trainer(components, run_dir, resume_from=plan.checkpoint)
        try:
            summary = train(trainer)
            # Every rank done before any tears its process group down: a rank that leaves while another still
            # talks to it can abort in the collective library's teardown. Only here, on success: after a
            # failure another rank may be inside a collective, where a barrier would wait for ever.
            trainer.dist.barrier()
            return summary
        finally:
            trainer.reward.close()
            trainer.dist.shutdown()


__all__ = ["Terminated", "run", "train"]
