"""The command line answers before torch loads: ``--help``, ``--help KEY`` and every problem of the light
checks (``components.early_problems``: unknown keys, wrong types, bad values, the schema's rules, plugin
paths that do not import) import neither torch nor transformers nor the other heavy libraries; the
checks that need torch run when the light ones found nothing, still before any model loads, all in one
message. The config's copy of the maths' names is the maths' own."""

import os
import subprocess
import sys

import pytest

from areal_trainer.components import LATER_CHECKS, load_config, problems_and_build
from areal_trainer.config import maths
from areal_trainer.config.loader import compose_dict, convert

from ..e2e.helpers import cli_env

HEAVY = ("torch", "transformers", "accelerate", "datasets", "peft", "wandb", "vllm")
# The real command line, run as `python -m areal_trainer`, reporting at exit which heavy modules it imported.
WRAPPER = f"""import runpy, sys
code = 0
try:
    runpy.run_module("areal_trainer", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print("heavy modules loaded: " + ",".join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
sys.exit(code)
"""


def _run(args: list[str], cwd) -> tuple[subprocess.CompletedProcess, list[str]]:
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=cwd, env=cli_env(), capture_output=True,
                          text=True, timeout=300)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("heavy modules loaded: ")][-1]
    return proc, [m for m in line.split(": ", 1)[1].split(",") if m]


@pytest.mark.e2e  # the real command line, in a subprocess
@pytest.mark.parametrize("args", [["--help"], ["--help", "actor.eps_clip"]], ids=["help", "help-key"])
def test_help_imports_no_heavy_module(tmp_path, args):
    proc, loaded = _run(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "actor.eps_clip" in proc.stdout
    assert loaded == []


@pytest.mark.e2e  # the real command line, in a subprocess
def test_a_typo_is_reported_without_importing_torch(tmp_path):
    proc, loaded = _run(["--config-name", "grpo", "actor.eps_clipp=0.3"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "Error: 1 configuration problem:\n  - actor.eps_clipp: not a configuration key. Did you mean " \
           "'actor.eps_clip'?\n" + LATER_CHECKS + "\n" in proc.stderr
    assert loaded == []


@pytest.mark.e2e  # the real command line, in a subprocess
def test_bad_values_rules_and_plugin_paths_are_reported_together_without_importing_torch(tmp_path):
    proc, loaded = _run(["--config-name", "grpo", "gconfig.n_samples=0", "actor.kl_estimator=k4",
                         "actor.adv_norm.mean_level=row", "reward.fn=mypkg.rewards.score",
                         "rollout.workflow=tests.plugins_broken.Flow", "rollout.dynamic_filter=mypkg.filters.keep",
                         "actor.path=./no/such/model"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    for needle in ("gconfig.n_samples: got 0; must be >= 1.",
                   "actor.kl_estimator: got 'k4'; must be one of 'k1', 'k2', 'k3'.",
                   "actor.adv_norm.mean_level: got 'row'; must be one of 'batch', 'group', null.",
                   "reward.fn: module 'mypkg.rewards' not found (from 'mypkg.rewards.score')",
                   "rollout.workflow: importing 'tests.plugins_broken' raised RuntimeError: boom while importing",
                   "rollout.dynamic_filter: module 'mypkg.filters' not found",
                   "actor.path: './no/such/model' does not exist"):
        assert f"  - {needle}" in proc.stderr, needle
    assert LATER_CHECKS in proc.stderr
    assert loaded == []
    assert not (tmp_path / "outputs").exists()


@pytest.mark.e2e  # the real command line, in a subprocess
def test_an_agent_that_does_not_import_is_reported_without_importing_torch(tmp_path):
    proc, loaded = _run(["--config-name", "grpo", "rollout.agent=mypkg.agents.run"], tmp_path)
    assert proc.returncode == 2
    assert "  - rollout.agent: module 'mypkg.agents' not found (from 'mypkg.agents.run')" in proc.stderr
    assert loaded == []


@pytest.mark.e2e  # the real command line, in a subprocess
def test_the_checks_that_need_torch_run_once_the_light_ones_find_nothing(tmp_path):
    proc, loaded = _run(["--config-name", "grpo", "actor.eps_clip=-1", "actor.rejection_sampling.upper=0.5",
                         "rollout.workflow=areal_trainer.rollout.workflows.single_turn.NoSuchWorkflow"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "Error: 3 configuration problems:" in proc.stderr
    for needle in ("actor.rejection_sampling.upper: got 0.5; must be > 1.0 for metric 'ratio'",
                   ("rollout.workflow: module 'areal_trainer.rollout.workflows.single_turn' has no attribute "
                    "'NoSuchWorkflow'"),
                   "actor.eps_clip: got -1.0; must be >= 0."):
        assert f"  - {needle}" in proc.stderr, needle
    assert LATER_CHECKS not in proc.stderr  # this was the whole check
    assert "torch" in loaded
    assert not (tmp_path / "outputs").exists()  # before any model loads, without a run directory


@pytest.mark.e2e  # the real command line, in a subprocess
def test_printing_the_config_is_not_stopped_by_its_rules(tmp_path):
    proc, loaded = _run(["--config-name", "grpo", "gconfig.n_samples=1", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "n_samples: 1" in proc.stdout
    assert loaded == []


def test_the_light_part_leaves_out_exactly_the_checks_that_need_torch():
    cfg = convert(compose_dict("grpo", ["++actor.eps_clip=-1", "++actor.rejection_sampling.upper=0.5",
                                        "++rollout.workflow=areal_trainer.rollout.workflows.single_turn.NoSuchWorkflow",
                                        "++reward.model.path=/no/such/reward_model", "++gconfig.n_samples=0"]))
    light, whole = problems_and_build(cfg, light=True)[0], problems_and_build(cfg)[0]
    assert "gconfig.n_samples: got 0; must be >= 1." in light
    assert [p for p in whole if p in light] == light  # the light part's problems, in the same order
    later = [p.split(":")[0] for p in whole if p not in light]
    assert later == ["actor.rejection_sampling.upper", "reward.model.path", "rollout.workflow", "actor.eps_clip"]


def test_a_clean_config_passes_both_parts():
    cfg = load_config("grpo")
    assert problems_and_build(cfg, light=True)[0] == []
    assert problems_and_build(cfg)[2] is not None


def test_the_configs_names_are_the_maths_own():
    from areal_trainer.advantage import gae, normalize
    from areal_trainer.loss import aggregate, kl, prox, ratio

    assert maths.GAE_UNITS == gae.TIME_UNITS
    assert maths.NORM_LEVELS == normalize.NORM_LEVELS
    assert maths.LOSS_AGG_MODES == aggregate.LOSS_AGG_MODES
    assert maths.KL_ESTIMATORS == kl.KL_ESTIMATORS
    assert maths.PROX_LOGP_METHODS == prox.PROX_LOGP_METHODS
    assert maths.IS_LEVELS == ratio.IS_LEVELS


def test_the_configs_names_are_the_agents_own():
    from areal_trainer.config import rollout
    from areal_trainer.rollout.agents import trajectory, workflow

    assert rollout.AGENT_EXPORTS == trajectory.EXPORTS
    assert rollout.AGENT_BATCHING == workflow.BATCHING


def test_the_light_modules_import_no_torch():
    """What the command line imports before its checks, imported alone in a fresh interpreter."""
    code = ("import sys; import areal_trainer.__main__, areal_trainer.components, areal_trainer.config.help, "
            "areal_trainer.config.validate; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ""
