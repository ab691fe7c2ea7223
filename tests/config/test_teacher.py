"""The ``teacher`` section: every bad value is reported before anything loads, all at once, each naming
its key; the two ways to give several teachers compose; the distill preset binds the distillation loss."""

import pytest

from areal_trainer.components import load, load_config
from areal_trainer.config import ConfigError
from areal_trainer.loss import DistillLoss


def _problems(overrides, name="grpo") -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(name, overrides)
    return info.value.problems


def test_distill_preset_is_pure_distillation_with_the_joint_form():
    built = load("distill")
    t = built.config.teacher
    assert (t.form, t.rl_loss_weight, t.pure) == ("joint", 0.0, True)
    assert (isinstance(built.loss, DistillLoss) and built.distill.pure
            and built.distill.teachers[0].path == "builtin:tiny")
    assert load("grpo").distill is None  # no teacher: nothing changes


def test_several_teachers_compose_key_by_key_or_as_one_map():
    a = load_config("grpo", ["+teacher.teachers.math.path=builtin:tiny", "teacher.teachers.math.weight=2",
                             "+teacher.teachers.code={path: builtin:small}"]).teacher
    assert {n: (t.path, t.weight) for n, t in a.teachers.items()} == {"math": ("builtin:tiny", 2.0),
                                                                      "code": ("builtin:small", 1.0)}
    assert a.form == "mopd" and a.weights == (0.0, 0.005)


def test_every_bad_teacher_value_is_reported_together():
    p = "\n".join(_problems(["+teacher.path=/no/such/dir", "teacher.rl_loss_weight=-1",
                             "teacher.distill_loss_weight=nan", "teacher.temperature=0", "teacher.device=tpu"]))
    assert "teacher.path: '/no/such/dir' does not exist" in p
    assert "teacher.rl_loss_weight: got -1.0; must be a finite number >= 0." in p
    assert "teacher.distill_loss_weight: got nan" in p
    assert "teacher.temperature: got 0" in p and "teacher.device: got 'tpu'" in p


@pytest.mark.parametrize("overrides,message", [
    (["+teacher.path=builtin:tiny", "teacher.rl_loss_weight=0", "teacher.distill_loss_weight=0"],
     "teacher.rl_loss_weight and teacher.distill_loss_weight are both 0"),
    (["+teacher.teachers.a.path=builtin:tiny", "teacher.mopd.rl_coefficient=0",
      "teacher.mopd.distillation_coefficient=0"],
     "teacher.mopd.rl_coefficient and teacher.mopd.distillation_coefficient are both 0"),
    (["+teacher.teachers.a.path=builtin:tiny", "+teacher.mopd.routes.mixed.b=1.0"],
     "teacher.mopd.routes.mixed.b: no teacher is named 'b'; the teachers are a"),
    (["+teacher.teachers.a.path=builtin:tiny", "teacher.teachers.a.weight=-2"], "teacher.teachers.a.weight: got -2.0"),
    (["+teacher.teachers.a.path=builtin:tiny", "teacher.mopd.importance_ratio_cap=inf"],
     "teacher.mopd.importance_ratio_cap: got inf"),
    (["+teacher.teachers.a.path=builtin:tiny", "teacher.loss_form=joint"],
     "teacher.loss_form='joint' takes one teacher"),
    (["+teacher.teachers.a.path=builtin:tiny", "+teacher.path=builtin:tiny"],
     "teacher.path and teacher.teachers are both set"),
    (["+teacher.teachers.a.path=builtin:tiny", "teacher.rl_loss_weight=0.5"],
     "teacher.rl_loss_weight=0.5 weighs the single-teacher forms"),
    (["+teacher.dtype=float32"], "teacher: no teacher"),
    (["+teacher.path=builtin:tiny", "teacher.loss_form=kd"], "teacher.loss_form: got 'kd'"),
])
def test_bad_teacher_settings_name_their_key(overrides, message):
    assert any(message in p for p in _problems(overrides)), _problems(overrides)


def test_pure_distillation_with_a_critic_is_an_error():
    p = _problems(["+teacher.path=builtin:tiny", "teacher.rl_loss_weight=0", "teacher.distill_loss_weight=1"],
                  name="ppo")
    assert any("critic would fit nothing" in x for x in p)


def test_pure_distillation_with_one_answer_per_prompt_is_not_a_useless_run():
    load("distill", ["gconfig.n_samples=1"])  # no reward, no group normalisation: nothing to warn about


def test_teachers_that_cannot_teach_are_warned_about(tmp_path):
    with pytest.warns(UserWarning, match=r"teacher.path='builtin:tiny' is the built-in model untrained") as got:
        load("distill")  # the preset as shipped, with the built-in student
    # the first of that warning: another (a ResourceWarning of a collected event loop) may land in the block
    said = next(str(w.message) for w in got if "builtin:tiny" in str(w.message))
    assert "checkpoints/step_<N>" in said
    (tmp_path / "config.json").write_text("{}")  # a checkpoint directory (nothing loads here)
    with pytest.warns(UserWarning, match=r"teacher.teachers.b.path='builtin:small' is the built-in model untrained"):
        load("grpo", [f"+teacher.teachers.a.path={tmp_path}", "+teacher.teachers.b.path=builtin:small"])
    with pytest.warns(UserWarning, match=r"is the student's own starting model \(actor.path\)"):
        load("distill", [f"actor.path={tmp_path}", "allow_builtin_model_on_any_data=true"])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checkpoint as teacher: nothing to say
        load("distill", [f"teacher.path={tmp_path}"])


def test_an_empty_directory_is_named_as_such_before_anything_loads(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p = "\n".join(_problems([f"actor.path={empty}", f"+teacher.path={empty}"]))
    assert f"actor.path: '{empty}' is an empty directory. Give a checkpoint directory" in p
    assert f"teacher.path: '{empty}' is an empty directory." in p and "does not exist" not in p
