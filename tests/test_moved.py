"""Module paths that moved in the rollout/ and train/ split keep working for a release: the old path
gives the one module at its new path, with one warning that names the new path."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings

import pytest

from areal_trainer.moved import MOVED, MOVED_NAMES, MovedModuleWarning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_path_is_the_new_module(old):
    new = importlib.import_module(MOVED[old])
    assert not os.path.exists(os.path.join(ROOT, *old.split(".")) + ".py"), f"{old} is a file again: drop its alias"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MovedModuleWarning)
        assert importlib.import_module(old) is new
    assert new.__spec__.name == MOVED[old]  # the alias did not rename the module


def test_an_old_path_warns_once_naming_the_new_one():
    code = ("import warnings; warnings.simplefilter('default')\n"
            "from areal_trainer.rollout.multiturn import MultiTurnWorkflow\n"
            "from areal_trainer.rollout.agents.multi_turn import MultiTurnWorkflow as New\n"
            "assert MultiTurnWorkflow is New\n"
            "import areal_trainer.rollout.multiturn\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "MovedModuleWarning" in x]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("<string>:2: "), lines[0]  # the importing line, not the import system
    assert "areal_trainer.rollout.multiturn is now areal_trainer.rollout.agents.multi_turn" in lines[0]


@pytest.mark.parametrize("old", sorted(MOVED_NAMES))
def test_names_that_left_their_module_are_found_under_the_old_path(old):
    mod, name = old.rsplit(".", 1)
    new_mod, new_name = MOVED_NAMES[old].rsplit(".", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MovedModuleWarning)
        got = getattr(importlib.import_module(mod), name)
    assert got is getattr(importlib.import_module(new_mod), new_name)


@pytest.mark.parametrize("old", ["areal_trainer.rollout.multiturn", "areal_trainer.rollout.workflows.multi_turn"])
def test_a_config_naming_an_old_plugin_path_runs_it_with_the_warning(monkeypatch, old):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported by another test
    from areal_trainer.components import load
    from areal_trainer.rollout.agents.multi_turn import MultiTurnWorkflow

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        components = load("grpo", [f"rollout.workflow={old}.MultiTurnWorkflow"])
    moved = [str(w.message) for w in caught if issubclass(w.category, MovedModuleWarning)]
    assert moved == [f"{old} is now areal_trainer.rollout.agents.multi_turn; the old path is an alias that goes in "
                     "the next release."]
    assert components.rollout.workflow is MultiTurnWorkflow
