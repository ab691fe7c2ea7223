"""RewardFunction: the two accepted forms told apart by signature, calls built with only the row
fields a function takes, clear start-up errors, and the checks on what functions return."""

import math

import pytest

from areal_trainer.errors import UserError
from areal_trainer.plugins import PluginError
from areal_trainer.reward.functions import RewardFunction, RewardSample

P = "tests.plugins."


def bind(name, style="auto", **kwargs):
    return RewardFunction.bind(P + name, kwargs=kwargs, key="reward.fn", style=style)


ROWS = [RewardSample("p1", "4", answer="4", fields={"solution": "4", "tolerance": 0.5, "id": 7}),
        RewardSample("p2", "5", answer="4", fields={"solution": "5", "tolerance": 0.1, "id": 8})]


@pytest.mark.parametrize("name, style, is_async", [
    ("exact", "sample", False), ("close_enough", "sample", False), ("echo_kwargs", "sample", False),
    ("accuracy", "batched", False), ("length_or_none", "batched", False),
    ("async_exact", "sample", True), ("async_batched", "batched", True),
])
def test_the_form_is_told_by_the_signature(name, style, is_async):
    fn = bind(name)
    assert (fn.style, fn.is_async, fn.name, fn.path) == (style, is_async, name, P + name)


def test_per_sample_calls_pass_only_the_fields_the_function_takes():
    fn = bind("close_enough")
    args, kwargs = fn.sample_call(ROWS[0])
    assert args == ("p1", "4", "4") and kwargs == {"tolerance": 0.5}
    assert fn.fn(*args, **kwargs) == 1.0
    assert fn.sample_call(RewardSample("p", "1", "2"))[1] == {}  # a row without the column: the default


def test_kwargs_gets_every_field_and_configured_kwargs_win():
    fn = bind("echo_kwargs", scale=2.0, id=0)
    args, kwargs = fn.sample_call(ROWS[0])
    assert kwargs == {"solution": "4", "tolerance": 0.5, "id": 0, "scale": 2.0}
    assert fn.fn(*args, **kwargs) == kwargs


def test_a_field_named_like_a_positional_parameter_is_not_passed():
    fn = bind("echo_kwargs")
    _, kwargs = fn.sample_call(RewardSample("p", "c", "a", fields={"prompt": "x", "answer": "y", "n": 1}))
    assert kwargs == {"n": 1}


def test_batched_calls_get_lists_by_name():
    fn = bind("accuracy")
    args, kwargs = fn.batch_call(ROWS)
    assert args == ()
    assert kwargs == {"prompts": ["p1", "p2"], "completions": ["4", "5"], "answer": ["4", "4"],
                      "solution": ["4", "5"], "tolerance": [0.5, 0.1], "id": [7, 8]}
    assert fn.fn(**kwargs) == [1.0, 1.0]
    named = bind("solution_only")  # no **kwargs: only what it names
    assert named.batch_call(ROWS)[1] == {"completions": ["4", "5"], "solution": ["4", "5"]}


def test_style_can_be_forced():
    assert bind("echo_kwargs", style="batched").style == "batched"
    assert bind("echo_kwargs", style="sample").style == "sample"
    with pytest.raises(PluginError, match=r"^reward.fn: style 'rows' is not one of 'auto', 'sample', 'batched'"):
        bind("exact", style="rows")


@pytest.mark.parametrize("name", ["one_arg", "two_args"])
def test_a_signature_that_fits_neither_form_names_the_key_and_both_forms(name):
    with pytest.raises(PluginError) as e:
        bind(name)
    msg = str(e.value)
    assert msg.startswith(f"reward.fn: tests.plugins.{name}(")
    assert "fits neither" in msg and "per sample: fn(prompt, completion, answer" in msg
    assert "batched, as in TRL: fn(prompts, completions" in msg


def test_kwargs_that_do_not_fit_are_a_plugin_error():
    with pytest.raises(PluginError, match=r"^reward.fn: the kwargs \{'tol': 1\} do not fit .*close_enough.*"
                                          r"It accepts the keyword arguments tolerance\.$"):
        bind("close_enough", tol=1)
    with pytest.raises(PluginError, match=r"^reward.fn: kwargs \['completions'\] collide"):
        bind("accuracy", completions=[])
    with pytest.raises(PluginError, match=r"^reward.fn: kwargs \['answer'\] collide"):
        bind("echo_kwargs", answer=1)
    with pytest.raises(PluginError, match="positional-only parameter 'extra'"):
        bind("positional_only")
    with pytest.raises(PluginError, match="not a callable"):
        bind("NOT_CALLABLE")
    assert bind("echo_kwargs", anything=1).kwargs == {"anything": 1}  # **kwargs takes any keyword


def test_a_missing_required_column_is_named():
    fn = bind("takes_solution")
    with pytest.raises(UserError, match=r"needs 'solution', which neither the dataset rows \(columns: id\)"):
        fn.sample_call(RewardSample("p", "c", "a", fields={"id": 1}))


def test_results_are_checked():
    fn = bind("exact")
    assert fn.check(0.5) == ("ok", 0.5) and fn.check(1) == ("ok", 1.0)
    assert fn.check(True) == ("ok", 1.0) and fn.check(None) == ("none", None)
    status, value = fn.check(float("nan"))
    assert status == "nonfinite" and math.isnan(value)
    assert fn.check(float("-inf"))[0] == "nonfinite"
    # finite, but infinite once the trainer makes it a float32 tensor
    assert fn.check(1e39) == ("out_of_range", 1e39) and fn.check(10 ** 400)[0] == "out_of_range"
    assert fn.check(-3.4e38) == ("ok", -3.4e38)
    with pytest.raises(UserError, match=r"^reward.fn: reward function tests.plugins.exact returned '1.0' \(str\)"):
        fn.check("1.0")


def test_batched_results_must_be_a_list_of_the_right_length():
    fn = bind("wrong_length")
    with pytest.raises(UserError, match=r"batched reward function tests.plugins.wrong_length returned 1 "
                                        r"values for 2 completions \(\[1.0\]\)"):
        fn.check_batch(fn.fn(**fn.batch_call(ROWS)[1]), 2)
    fn = bind("not_a_list")
    with pytest.raises(UserError, match=r"tests.plugins.not_a_list returned 1.0 \(float\); it must return a list"):
        fn.check_batch(1.0, 2)
    fn = bind("mixed_batch")
    checked = fn.check_batch(fn.fn(completions=[]), 4)
    assert [s for s, _ in checked] == ["nonfinite", "none", "ok", "ok"] and checked[2:] == [("ok", 1.0), ("ok", 2.0)]
    with pytest.raises(UserError, match=r"returned \[0.5\] \(list\) at position 1 of its list"):
        fn.check_batch([0.5, [0.5]], 2)
