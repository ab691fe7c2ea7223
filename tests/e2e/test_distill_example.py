"""The distillation example (examples/distill/) as its README runs it, shortened: a teacher trained here, the
one sweep of its four arms through the real command line (``--config-dir examples/distill +arm=...``),
and its summary (``compare.py``): the table and the plot."""

import os
import subprocess
import sys

from .helpers import ROOT, cli, cli_env

ARMS = ("rl", "distill", "rl_distill", "rl_distill_joint")


def test_the_examples_sweep_of_four_arms_and_its_summary(tmp_path):
    cli(["--config-name", "grpo", "+scale=tiny", "seed=7", "total_train_steps=3", "actor.optimizer.lr=1e-2",
         "hydra.run.dir=teacher"], cwd=tmp_path)
    ckpt = tmp_path / "teacher" / "checkpoints" / "step_3"
    assert ckpt.is_dir()
    sweep = tmp_path / "sweep"
    out = cli(["-m", "--config-dir", os.path.join(ROOT, "examples", "distill"), "--config-name", "grpo",
               f"+arm={','.join(ARMS)}", "+scale=tiny", "seed=1", "evaluator.freq_steps=1",
               f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env={"DISTILL_TEACHER": str(ckpt)}, timeout=600)
    runs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert runs == ["0-grpo-seed1", "1-distill-seed1", "2-grpo_distill-seed1", "3-grpo_distill_joint-seed1"], out.stdout
    for run in runs[1:]:  # every distilling arm loaded the teacher from the environment's path
        assert f"path: {ckpt}\n" in (sweep / run / ".hydra" / "config.yaml").read_text(), run
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "distill", "compare.py"), str(sweep),
                        str(tmp_path / "teacher")], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    md = (sweep / "distillation.md").read_text()
    assert (sweep / "distillation.png").stat().st_size > 10_000
    assert md.count("| RL alone (GRPO) |") == 3  # accuracy, cost and the per-run table
    for name in ("pure distillation", "RL + distillation (advantage)", "RL + distillation (joint, AReaL)"):
        assert md.count(f"| {name} |") == 4, name  # and the reverse KL to the teacher
    assert "step 0 | step 1 | step 2 |" in md and "Teacher: " in md and "| steps 1–1 | steps 2–2 |" in md
    assert (sweep / "comparison.md").is_file()  # the sweep's own summary is still there
