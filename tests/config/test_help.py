"""``--help``: keys, types, defaults and descriptions come from the schema; unknown keys get a suggestion."""

import os
import subprocess
import sys
import typing

import pytest

from areal_trainer.config.actor import PPOActorConfig, PPOCriticConfig
from areal_trainer.config.bookkeeping import WandbConfig
from areal_trainer.config.help import UnknownKeyError, first_sentence, help_request, key_help, overview
from areal_trainer.config.keys import field_doc, index, render_type
from areal_trainer.config.overrides import config_dirs, config_groups, normalize_overrides, split_overrides
from areal_trainer.config.rollout import RolloutConfig

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
# Keys without a description (shown as "(no description)"). Document new fields instead of adding here.
KNOWN_UNDOCUMENTED: set[str] = set()


def flat(text: str) -> str:
    """The text with its line wrapping undone."""
    return " ".join(text.split())


def shown(doc: str) -> str:
    """A docstring as the help shows it (one line, RST literals in single backticks)."""
    return flat(doc).replace("``", "`")


@pytest.fixture(scope="module")
def text():
    return overview(width=100)


@pytest.mark.parametrize("line,doc", [
    ("actor.eps_clip: float = 0.2", "Lower clip epsilon; also the upper one unless `eps_clip_higher` is set."),
    ("rollout.max_head_offpolicyness: int = 0",
     "eta: the most policy versions a trained token may lag behind the policy being trained."),
    ("gconfig.n_samples: int = 1", "Answers sampled per prompt: the group size G."),
    ("actor.eps_clip_higher: float | null = null", "Upper clip epsilon"),
    ("rollout.vllm_kwargs: dict = {}", "Extra keyword arguments for `vllm.LLM`"),
    ("gconfig.stop_token_ids: list[int] = []", "Extra token ids that end an answer"),
    ("actor.advantage.compute.implementation: str = default", "A built-in name"),
    ("actor.optimizer.lr: float = 0.001", "Peak learning rate"),
])
def test_overview_lists_keys_with_type_default_and_description(text, line, doc):
    lines = text.splitlines()
    at = lines.index("  " + line)
    assert flat("\n".join(lines[at + 1: at + 4])).startswith(doc)


def test_overview_is_grouped_by_section_and_ends_with_usage(text):
    lines = text.splitlines()
    for header in ("Top-level keys", "gconfig", "actor", "actor.rejection_sampling (null by default)", "rollout"):
        assert header in lines
    assert lines.index("Top-level keys") < lines.index("  seed: int = 1") < lines.index("gconfig")
    usage = text[text.index("\nUsage\n"):]
    for part in ("--config-name PRESET", "grpo", "algo=NAME", "-m ", "--help KEY", "--hydra-help"):
        assert part in usage
    assert max(len(line) for line in lines) <= 100


def test_overview_shows_first_sentences_and_shortens_repeated_sections(text):
    full = shown(field_doc(RolloutConfig, "offpolicy_mode"))
    assert first_sentence(field_doc(RolloutConfig, "offpolicy_mode")) in flat(text)
    assert full not in flat(text)
    assert "Same keys and defaults as `actor`" in text and "ref.eps_clip:" not in text
    assert "ref.eps_clip: float = 0.2" in key_help("ref")


def test_section_query_lists_its_keys_with_full_descriptions():
    out = key_help("actor.rejection_sampling")
    assert out.splitlines()[0] == "actor.rejection_sampling (null by default)"
    for name in ("level", "action", "metric", "agg", "upper", "lower"):
        assert f"  actor.rejection_sampling.{name}: " in out
    assert "actor.rejection_sampling.upper: float = 5.0" in out
    assert "actor.rejection_sampling.lower: float | null = null" in out
    assert "Only used with `actor.use_decoupled_loss=true`." in flat(out)  # the class docstring, 2nd paragraph
    assert "actor.eps_clip" not in out


def test_single_key_shows_its_full_docstring():
    out = key_help("rollout.offpolicy_mode")
    assert out.startswith("rollout.offpolicy_mode: str = concurrent\n")
    assert shown(field_doc(RolloutConfig, "offpolicy_mode")) in flat(out)
    assert key_help("actor.eps_clip").startswith("actor.eps_clip: float = 0.2\n    Lower clip epsilon")


def test_docstrings_come_from_the_nearest_class_that_declares_the_field():
    assert field_doc(PPOCriticConfig, "eps_clip").startswith("Value clipping range")
    assert field_doc(PPOActorConfig, "eps_clip").startswith("Lower clip epsilon")
    assert field_doc(PPOCriticConfig, "temperature") == field_doc(PPOActorConfig, "temperature") != ""


def test_compat_notes_and_free_form_keys():
    assert "Has no effect here: a failed run is not restarted" in flat(key_help("recover.retries"))
    assert "free-form" in key_help("rollout.vllm_kwargs.gpu_memory_utilization")
    assert "grpo" in key_help("algo")


@pytest.mark.parametrize("cls,name,shown_as", [
    (RolloutConfig, "generation_batch_size", "int | null"), (RolloutConfig, "backend", "str"),
    (RolloutConfig, "request_timeout", "float"), (RolloutConfig, "partial_rollout", "bool"),
    (RolloutConfig, "vllm_kwargs", "dict"), (WandbConfig, "tags", "list[str]"), (PPOActorConfig, "gae_lambda", "any"),
])
def test_types_read_like_yaml(cls, name, shown_as):
    assert render_type(typing.get_type_hints(cls)[name]) == shown_as
    assert render_type(int | None) == "int | null"


def test_overrides_accept_every_key_the_help_lists_and_both_suggest_the_same_key():
    values = [f"{k}={key.value}" for k, key in index().items()
              if k and key.section is None and not key.free_form and key.value not in ("''", "[]", "{}")]
    problems, usable = split_overrides(values)
    assert not problems and len(usable) == len(values)
    for typo in ("actor.eps_clp", "actr.eps_clip", "rollout.max_head_ofpolicyness", "eps_clip"):
        with pytest.raises(UnknownKeyError) as e:
            key_help(typo)
        help_hint = str(e.value).split("key.", 1)[1].split(" `")[0]
        (override_problem,), _ = split_overrides([f"{typo}=1"])
        assert override_problem.endswith(help_hint), (override_problem, help_hint)


def test_undocumented_keys_are_known_and_marked():
    undocumented = {k for k, key in index().items() if k and not key.doc}
    print("keys without a description:", sorted(undocumented) or "none")
    assert undocumented <= KNOWN_UNDOCUMENTED, ("document these schema fields: "
                                                f"{sorted(undocumented - KNOWN_UNDOCUMENTED)}")
    values = sorted(k for k in undocumented if not index()[k].section)
    if values:
        assert "(no description)" in key_help(values[0])


@pytest.mark.parametrize("asked,suggestion", [
    ("actor.eps_clp", "Did you mean 'actor.eps_clip'?"),
    ("actr.eps_clip", "Did you mean 'actor.eps_clip'?"),
    ("actor.rejection_sampling.uper", "Did you mean 'actor.rejection_sampling.upper'?"),
    ("actor.rejection_samplin", "Did you mean 'actor.rejection_sampling'?"),
    ("rollout.eps_clip", "Did you mean 'actor.eps_clip'? (also: ref.eps_clip, critic.eps_clip)"),
    ("actor.eps_clip.low", "actor.eps_clip is a value, not a section."),
])
def test_unknown_keys_get_the_closest_key(asked, suggestion):
    with pytest.raises(UnknownKeyError) as e:
        key_help(asked)
    assert f"{asked!r} is not a configuration key." in str(e.value) and suggestion in str(e.value)


@pytest.mark.parametrize("argv,expected", [
    (["--help"], (True, None)), (["-h"], (True, None)), (["--help", "actor.eps_clip"], (True, "actor.eps_clip")),
    (["--help=actor.eps_clip"], (True, "actor.eps_clip")), (["--config-name", "grpo", "--help"], (True, None)),
    (["--help", "--config-name", "grpo"], (True, None)), (["--help", "actor.eps_clip=0.3"], (True, None)),
    (["--hydra-help"], (False, None)), (["actor.eps_clip=0.3"], (False, None)),
])
def test_help_request(argv, expected):
    assert help_request(argv) == expected


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_trainer", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_unknown_key_exits_2_with_a_suggestion_and_no_traceback():
    r = _cli("--help", "actor.eps_clp")
    assert r.returncode == 2
    assert "Error: 'actor.eps_clp' is not a configuration key. Did you mean 'actor.eps_clip'?" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_cli_help_equals_key():
    r = _cli("--help=actor.eps_clip")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("actor.eps_clip: float = 0.2\n") and "Traceback" not in r.stderr


def test_config_groups_of_a_config_dir_are_accepted_and_others_still_refused(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "a.yaml").write_text("# @package _global_\nseed: 3\n")
    (tmp_path / "notes").mkdir()  # a folder without YAML files is not a group
    argv = ["--config-dir", str(tmp_path), "+experiment=a", "+notes=x"]
    assert config_dirs(argv) == [str(tmp_path)] and config_dirs([f"--config-dir={tmp_path}"]) == [str(tmp_path)]
    groups = config_groups(config_dirs(argv))
    assert "experiment" in groups and "notes" not in groups and "algo" in groups
    assert normalize_overrides(["+experiment=a", "+seed=2"], groups) == ["+experiment=a", "++seed=2"]
    problems, usable = split_overrides(["+experiment=a", "+notes=x"], groups)
    assert (usable == ["+experiment=a"] and len(problems) == 1
            and problems[0].startswith("notes: not a configuration key."))
    (problem,), _ = split_overrides(["+experiment=a"])  # without the folder it is not a group
    assert problem.startswith("experiment: not a configuration key.")


def test_cli_composes_a_group_of_a_config_dir(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "a.yaml").write_text("# @package _global_\nseed: 3\nactor:\n  eps_clip: 0.25\n")
    r = _cli("--config-dir", str(tmp_path), "--config-name", "grpo", "+experiment=a", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    assert "\nseed: 3\n" in r.stdout and "eps_clip: 0.25" in r.stdout


def test_files_of_your_own_config_groups_are_checked_with_the_command_line(tmp_path):
    from areal_trainer.config.overrides import group_file_problems

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "bad.yaml").write_text("# @package _global_\ndefaults:\n  - override /algo: ppo\n"
                                               "actor:\n  eps_clp: 0.3\n  ppo_n_minibatches: many\nseeed: 2\n")
    (tmp_path / "exp" / "packaged.yaml").write_text("eps_clip: 0.3\n")  # the default package: the group's name
    (tmp_path / "exp" / "good.yaml").write_text("# @package actor\neps_clip: 0.3\nkl_ctl: ${oc.env:X,0}\n")
    (tmp_path / "exp" / "broken.yaml").write_text("actor: [unclosed\n")
    problems = group_file_problems(["+exp=bad,packaged,good,broken,missing"], [str(tmp_path)])
    bad, packaged, broken = (str(tmp_path / "exp" / f"{n}.yaml") for n in ("bad", "packaged", "broken"))
    assert problems[:3] == [
        f"{bad}: actor.eps_clp: not a configuration key. Did you mean 'actor.eps_clip'?",
        f"{bad}: actor.ppo_n_minibatches: got 'many', which is not a valid int.",
        f"{bad}: seeed: not a configuration key. Did you mean 'seed'?"]
    assert problems[3].startswith(f"{packaged}: exp.eps_clip: not a configuration key. Did you mean 'actor.eps_clip'?")
    assert problems[4].startswith(f"{broken}: not valid YAML") and len(problems) == 5
    examples = os.path.join(ROOT, "examples", "distill")
    assert group_file_problems(["+arm=rl,distill,rl_distill,rl_distill_joint"], [examples]) == []
    r = _cli("--config-dir", str(tmp_path), "--config-name", "grpo", "+exp=bad", "actor.eps_clipp=1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "4 configuration problems" in r.stderr and "actor.eps_clipp: not a configuration key" in r.stderr
    assert f"{bad}: seeed: not a configuration key" in r.stderr
