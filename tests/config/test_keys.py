"""No silent keys: every key of the schema is read by the trainer, or is declared in
``config/compat.py`` as rejected (its other values are errors) or ignored (with a warning when set)."""

import ast
import fnmatch
import glob
import inspect
import os
import re
import warnings

import pytest

from areal_trainer.components import load_config
from areal_trainer.config.compat import IGNORED, REF_READ, REJECTED
from areal_trainer.config.keys import index
from areal_trainer.loss import SURROGATES

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DECLARATIONS = {f"config/{m}.py" for m in ("schema", "sampling", "data", "actor", "parts", "rollout", "bookkeeping",
                                           "launch", "compat", "keys", "base", "environment")}
"""Where the schema is declared (a field's own declaration and checks are not a read by the trainer)."""


def _attribute_reads(tree: ast.AST) -> set[str]:
    """Names read as attributes (``x.name``, ``getattr(x, "name")``), leaving out attributes of imported
    modules (``os.path``, ``torch.float32``)."""
    modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
               for a in n.names}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if not (isinstance(node.value, ast.Name) and node.value.id in modules):
                found.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            found.add(node.args[1].value)
    return found


def _names_read() -> set[str]:
    """Attributes the package reads outside the schema's declarations, the keyword arguments of the built-in
    surrogates (the loss binding reads the actor keys named like them), and ``${...}`` keys of the YAML."""
    found = set()
    for path in glob.glob(os.path.join(ROOT, "areal_trainer", "**", "*.py"), recursive=True):
        if os.path.relpath(path, os.path.join(ROOT, "areal_trainer")) in DECLARATIONS:
            continue
        with open(path) as f:
            found |= _attribute_reads(ast.parse(f.read()))
    for spec in SURROGATES.values():
        found |= {n for n, p in inspect.signature(spec.fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
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
    silent = [k for k, key in index().items() if k and key.section is None and key.name not in read
              and not _declared(k)]
    assert not silent, f"schema keys that nothing reads and config/compat.py does not declare: {silent}"


def test_the_reads_are_attribute_reads():
    """A name that only occurs as a word, a string or a local variable does not count as a read."""
    tree = ast.parse("import os\ndef f(cfg, eps_clip):\n    x = os.path\n"
                     "    return eps_clip + cfg.lr + getattr(cfg, 'seed')")
    assert _attribute_reads(tree) == {"lr", "seed"}


def test_declared_keys_exist():
    keys = list(index())
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
