"""No silent keys: every key of the schema is read by the trainer, or is declared in
``config/compat.py`` as rejected (its other values are errors) or ignored (with a warning when set)."""

import fnmatch
import glob
import io
import os
import re
import tokenize
import warnings

import pytest

from areal_trainer.config import load_config
from areal_trainer.config.compat import IGNORED, REF_READ, REJECTED
from areal_trainer.config.overrides import schema_keys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DECLARATIONS = {"config/schema.py", "config/actor.py", "config/parts.py", "config/compat.py"}
SECTIONS = {"gconfig", "eval_gconfig", "train_dataset", "valid_dataset", "actor", "ref", "critic", "rollout", "reward",
            "sft_warmup", "saver", "evaluator", "recover", "stats_logger", "scheduler", "cluster"}


def _names_read() -> set[str]:
    """Identifiers in the package outside the schema's declarations, and ``${...}`` keys of the YAML."""
    found = set()
    for path in glob.glob(os.path.join(ROOT, "areal_trainer", "**", "*.py"), recursive=True):
        if os.path.relpath(path, os.path.join(ROOT, "areal_trainer")) in DECLARATIONS:
            continue
        with open(path) as f:
            found |= {t.string for t in tokenize.generate_tokens(io.StringIO(f.read()).readline) if t.type == tokenize.NAME}
    for path in glob.glob(os.path.join(ROOT, "conf", "**", "*.yaml"), recursive=True):
        with open(path) as f:
            found |= {k.split(".")[-1] for k in re.findall(r"\$\{([\w.]+)\}", f.read())}
    return found


def _declared(key: str) -> bool:
    if key.startswith("ref.") and key.split(".")[1] not in REF_READ:
        return True  # warned about by compat_warnings
    return any(fnmatch.fnmatch(key, p) or key.startswith(p + ".") for p in [*REJECTED, *IGNORED])


def test_every_schema_key_is_read_or_declared():
    read = _names_read()
    silent = [k for k in schema_keys() if k not in SECTIONS and k.split(".")[-1] not in read and not _declared(k)]
    assert not silent, f"schema keys that nothing reads and config/compat.py does not declare: {silent}"


def test_declared_keys_exist():
    keys = schema_keys()
    for pattern in [*REJECTED, *IGNORED]:
        assert any(fnmatch.fnmatch(k, pattern) for k in keys), pattern


@pytest.mark.parametrize("override,message", [
    ("recover.retries=5", "recover.retries=5 has no effect here: a failed run is not restarted"),
    ("+ref.eps_clip=0.3", "ref.eps_clip is not used: the reference policy reads only ref.path and ref.dtype"),
])
def test_ignored_keys_warn_once_when_set(override, message):
    extra = ["actor.kl_ctl=0.01", "+ref.path=${actor.path}"] if "ref" in override else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config("grpo", [*extra, override])
    assert sum(message in str(w.message) for w in caught) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config("grpo", extra)
    assert not any("has no effect here" in str(w.message) or "is not used" in str(w.message) for w in caught)


@pytest.mark.parametrize("override,message", [
    ("actor.mb_spec.packing_algorithm=kk", "'kk' (Karmarkar-Karp) is not supported here"),
    ("+actor.is_critic=true", "actor.is_critic: got true; the value model is the `critic` section"),
    ("train_dataset.type=sft", "'sft' datasets (supervised fine-tuning) are not supported here"),
])
def test_rejected_values_name_the_key_and_the_fix(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config("grpo", [override])
