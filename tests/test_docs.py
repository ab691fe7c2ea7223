"""The documentation cites real code: every backticked path in docs/architecture.md exists, and every
``path::name`` names a function, class, method or top-level assignment defined in that file; in every document
(README, CONTRIBUTING, docs/, the examples' READMEs) every backticked path into the repository exists and every
relative link resolves."""

import ast
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "architecture.md")
CITED = re.compile(r"`([\w./-]+\.(?:py|md|yaml|json|sh))(?:::([\w.]+))?`")


def _citations() -> list[tuple[str, str | None]]:
    with open(DOC, encoding="utf-8") as f:
        return sorted(set(CITED.findall(f.read())))


def _defined(path: str) -> set[str]:
    """Top-level functions, classes and assignments, and ``Class.method`` / ``Class.attribute``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(f"{node.name}.{item.name}")
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(f"{node.name}.{item.target.id}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_document_cites_code():
    assert len([c for c in _citations() if c[1]]) >= 40


@pytest.mark.parametrize("path,name", _citations())
def test_every_cited_path_and_name_exists(path, name):
    full = os.path.join(ROOT, path)
    assert os.path.exists(full), f"docs/architecture.md cites {path}, which does not exist"
    if name:
        assert name in _defined(full), f"docs/architecture.md cites {path}::{name}, which is not defined there"


# -- the task documentation (README's section and docs/tasks.md) against the schema and --help -----------
TASK_DOCS = [os.path.join(ROOT, "docs", "tasks.md"), os.path.join(ROOT, "README.md")]
KEY = re.compile(r"`((?:reward|train_dataset|valid_dataset)\.[\w.]+)")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("path", TASK_DOCS, ids=os.path.basename)
def test_every_key_the_task_docs_name_exists(path):
    from areal_trainer.config.keys import lookup

    named = set(KEY.findall(_read(path)))
    assert len(named) >= 5
    assert [k for k in sorted(named) if lookup(k) is None] == []


def test_task_docs_and_help_give_the_same_reward_signatures_and_order_of_weights():
    from areal_trainer.config.help import key_help

    help_text = " ".join(key_help("reward").split())
    docs = " ".join(_read(TASK_DOCS[0]).split())
    for signature in ("fn(prompt, completion, answer, **row_fields) -> float | None",
                      "fn(prompts, completions, **columns) -> list[float | None]"):
        assert signature in help_text and signature in docs
    assert "the functions of `fn`, then `model`, then `url`" in help_text
    assert "the functions of `reward.fn` in list order, then `reward.model.path`, then `reward.url`" in docs
    data_help = " ".join(key_help("train_dataset").split())
    for column in ("`prompt`, `messages`, `question`", "`answer` when the rows have it"):
        assert column in data_help and column in docs


DOCUMENTS = sorted([os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CONTRIBUTING.md"),
                    *glob.glob(os.path.join(ROOT, "docs", "*.md")),
                    *glob.glob(os.path.join(ROOT, "examples", "**", "README.md"), recursive=True)])
REPO_PATH = re.compile(r"`((?:areal_trainer|tests|scripts|examples|conf|docs)/[\w./-]+?)(?:::[\w.]+)?`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: os.path.relpath(d, ROOT))
def test_every_path_and_link_of_a_document_exists(doc):
    text = _read(doc)
    named = (m.rstrip("/.") for m in REPO_PATH.findall(text))
    missing = [p for p in named if not os.path.exists(os.path.join(ROOT, p))]
    broken = [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")
              and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(doc), t)))]
    assert not missing, f"{os.path.relpath(doc, ROOT)} names paths that do not exist: {missing}"
    assert not broken, f"{os.path.relpath(doc, ROOT)} links to files that do not exist: {broken}"
