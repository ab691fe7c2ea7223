"""The resume table (``config/resume.py``): every key of the schema has a verdict from an explicit entry,
the longest prefix decides, and ``compare`` lists exactly the differing leaves."""

import pytest

from areal_trainer.config.keys import index
from areal_trainer.config.resume import NOT_COMPARED, REFUSED, SAFE, compare, flatten, rule


def test_every_top_level_key_has_an_entry_and_every_key_a_matching_prefix():
    keys = [k for k in index() if k]
    top = {k.split(".")[0] for k in keys}
    assert top <= set(SAFE) | set(REFUSED), sorted(top - set(SAFE) - set(REFUSED))
    for key in keys:
        assert any(key == p or key.startswith(p + ".") for p in (*SAFE, *REFUSED)), key


def test_no_prefix_is_in_both_tables():
    assert not set(SAFE) & set(REFUSED)


@pytest.mark.parametrize("key, safe", [
    ("actor.optimizer.lr", True), ("actor.optimizer.lr_scheduler_type", True), ("total_train_steps", True),
    ("saver.freq_steps", True), ("valid_dataset.path", True), ("reward.model.micro_batch_size", True),
    ("reward.timeout", True), ("actor.path", False), ("actor.use_lora", False), ("actor.lora_rank", False),
    ("critic.path", False), ("seed", False), ("algorithm", False), ("train_dataset.batch_size", False),
    ("gconfig.n_samples", False), ("reward.fn", False), ("reward.model.path", False), ("scheduler.type", False),
    ("scheduler.slurm_partition", True), ("rollout.max_head_offpolicyness", False),
    ("rollout.request_timeout", True), ("reward.kwargs.tolerance", False),
])
def test_verdicts(key, safe):
    assert rule(key)[0] is safe


def test_compare_lists_the_differing_leaves_with_their_verdicts():
    old = {"seed": 1, "actor": {"optimizer": {"lr": 1e-4}, "path": "a"}, "valid_dataset": None,
           "recover": {"mode": "disabled"}}
    new = {"seed": 1, "actor": {"optimizer": {"lr": 5e-5}, "path": "b"}, "valid_dataset": {"path": "x"},
           "recover": {"mode": "auto"}}
    got = {c.key: (c.old, c.new, c.safe) for c in compare(old, new)}
    assert got == {"actor.optimizer.lr": (1e-4, 5e-5, True), "actor.path": ("a", "b", False),
                   "valid_dataset": (None, None, True), "valid_dataset.path": (None, "x", True)}
    assert "recover.mode" in NOT_COMPARED


def test_flatten_keeps_lists_and_empty_sections_as_leaves():
    assert flatten({"a": {"b": [1, 2], "c": {}}, "d": None}) == {"a.b": [1, 2], "a.c": {}, "d": None}


def test_a_key_new_since_the_checkpoint_is_no_change_at_its_default():
    """A checkpoint written before a key existed resumes when the key keeps its default (the behaviour it had);
    a value other than the default is a change like any other."""
    old = {"rollout": {"backend": "hf"}}
    defaults = {"rollout": {"backend": "hf", "chat_template_type": "hf", "server_addrs": []}}
    assert compare(old, {"rollout": {"backend": "hf", "chat_template_type": "hf"}}, defaults) == []
    (change,) = compare(old, {"rollout": {"backend": "hf", "chat_template_type": "concat"}}, defaults)
    assert (change.key, change.old, change.new, change.safe) == ("rollout.chat_template_type", None, "concat", False)
    (change,) = compare(old, {"rollout": {"backend": "hf", "chat_template_type": "hf"}})  # no defaults known
    assert change.key == "rollout.chat_template_type"
