"""The package's layers import downward only, and no import cycle exists, lazy imports included.

Layers, bottom to top (docs/architecture.md): small utilities (``errors``, ``dtypes``, ``metrics``,
``faults``, then ``plugins`` and ``failures``); the pure maths (``loss``, which imports nothing of the package but
``errors``, then ``advantage``, which imports only the loss and ``errors``); ``config``; the parallelism
helpers (``fsdp``, then ``dist``); ``model``; the peers ``data``, ``reward``, ``rollout``, ``tracking``,
which do not import each other; ``environments`` (the hubs' environments as rows, a reward source and agents,
over the peers); ``components``, which binds a configuration to everything below;
``train``, the only orchestrator; ``launch``; the entry point. A module may import from its own unit and
from units below it. Imports inside functions count too (a lazy import is still a dependency). Inside
``rollout`` and ``train`` the subsystems (engines, workflows, agents) keep to their side too
(``SUBSYSTEMS``).

Below ``components`` nothing imports ``config``: those modules are handed what they need (values,
bound settings, or a config section passed in), so a setting has one reader, the binding.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "areal_trainer")
LAYERS = [("errors", "dtypes", "metrics", "faults", "moved"), ("plugins", "failures"), ("loss",), ("advantage",),
          ("config",), ("fsdp",), ("dist",), ("model",), ("data", "reward", "rollout", "tracking"),
          ("environments",), ("components",), ("train",), ("launch",), ("__main__", "__init__")]
HANDED_CONFIG = {u for units in LAYERS[:LAYERS.index(("components",))] for u in units} - {"config"}
"""The units below ``components``: they never import ``config``."""
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def modules() -> dict[str, str]:
    """Dotted module name (relative to the package) -> file path."""
    out = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__") or "__init__"] = os.path.join(dirpath, f)
    return out


def imports(name: str, path: str) -> set[str]:
    """Package-relative modules that ``name`` imports, anywhere in it (lazy imports in functions too)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = name.split(".")[:-1] if not path.endswith("__init__.py") else name.split(".")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                names = [target] + [f"{target}.{a.name}" if target else a.name for a in node.names]
            elif node.module and node.module.split(".")[0] == "areal_trainer":
                target = node.module.removeprefix("areal_trainer").lstrip(".")
                names = [target] + [f"{target}.{a.name}" if target else a.name for a in node.names]
            else:
                continue
            found.update(n for n in names if n)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("areal_trainer.") for a in node.names
                         if a.name.startswith("areal_trainer."))
    return found


def unit(module: str) -> str:
    return module.split(".")[0]


MODULES = modules()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_downward(name):
    mine = unit(name)
    assert mine in RANK, f"{name}: its unit {mine!r} has no layer; add it to LAYERS (and the README's Layout)"
    bad = []
    for target in sorted(imports(name, MODULES[name])):
        other = unit(target)
        if other == mine or other not in RANK or target not in MODULES and target.rsplit(".", 1)[0] not in MODULES:
            continue
        if RANK[other] >= RANK[mine]:
            bad.append(target)
    assert not bad, f"{name} (layer {RANK[mine]}: {mine}) imports from the same or a higher layer: {bad}"


def test_the_maths_import_nothing_of_the_package_but_the_maths():
    """``loss`` imports nothing of the package; ``advantage`` only itself and the loss (its KL estimators).
    Both may raise ``errors.PluginOutputError`` (``errors`` imports nothing) when a user function's output
    breaks its contract."""
    allowed = {"loss": {"loss", "errors"}, "advantage": {"advantage", "loss", "errors"}}
    for name, path in MODULES.items():
        if unit(name) in allowed:
            bad = sorted(t for t in imports(name, path) if unit(t) in RANK and unit(t) not in allowed[unit(name)])
            assert not bad, f"{name} imports {bad}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if unit(n) in HANDED_CONFIG))
def test_nothing_below_the_binding_imports_config(name):
    bad = sorted(t for t in imports(name, MODULES[name]) if unit(t) == "config")
    assert not bad, f"{name} imports {bad}: take the values (or the section) as arguments instead"


SUBSYSTEMS = {
    "rollout.engines": ("rollout.agents", "rollout.workflows", "rollout.servers"),
    "rollout.workflows": ("rollout.agents", "rollout.servers"),
    "rollout.servers": ("rollout.agents", "rollout.workflows"),
    "rollout": ("rollout.engines", "rollout.agents", "rollout.workflows", "rollout.servers"),
    "train": ("rollout.agents", "rollout.servers"),
}
"""Inside the layers: a subsystem (its modules) -> what it never imports. Engines sample and know nothing
of who asks; servers run an engine in a process of its own and are an engine to the trainer; workflows are
written against an engine; agents run on both. ``rollout``'s own top-level modules (the shared types,
batches, limits) import none of its subsystems. ``train`` never imports the agents (their endpoint, sessions,
tools) nor the servers (it gets an engine): it sees a workflow's rows only."""


def _subsystem(name: str) -> str | None:
    if name.startswith("train"):
        return "train"
    parts = name.split(".")
    if parts[0] != "rollout":
        return None
    is_package = MODULES[name].endswith("__init__.py")
    return ".".join(parts[:2]) if len(parts) > 2 or len(parts) == 2 and is_package else "rollout"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _subsystem(n)))
def test_subsystems_keep_to_their_side(name):
    forbidden = SUBSYSTEMS.get(_subsystem(name), ())
    bad = sorted(t for t in imports(name, MODULES[name]) if any(t == f or t.startswith(f + ".") for f in forbidden))
    assert not bad, f"{name} imports {bad}; {_subsystem(name)} never imports {', '.join(forbidden)}"


def test_environments_keep_to_the_agents_and_the_reward_service():
    """The environments run on what every agent and reward function runs on (the agent session, the reward
    service, the rows): never on an engine, a server or another workflow of their own."""
    forbidden = ("rollout.engines", "rollout.servers", "rollout.workflows", "tracking")
    for name, path in MODULES.items():
        if unit(name) == "environments":
            bad = sorted(t for t in imports(name, path) if any(t == f or t.startswith(f + ".") for f in forbidden))
            assert not bad, f"{name} imports {bad}"


def test_the_subsystems_are_packages():
    for sub in SUBSYSTEMS:
        if sub.count("."):
            assert sub in MODULES, f"{sub} is not a package (areal_trainer/{sub.replace('.', '/')}/__init__.py)"


def test_no_import_cycle():
    """No cycle among the modules, counting imports inside functions: a lazy import hides a cycle from the
    interpreter, not from the design."""
    graph = {n: {t if t in MODULES else t.rsplit(".", 1)[0] for t in imports(n, p)} & MODULES.keys()
             for n, p in MODULES.items()}
    assert_acyclic(graph)


def test_the_checks_see_an_import_inside_a_function_and_a_cycle_through_it(tmp_path):
    """The two checks above can fail: a lazy import is found, and a cycle closed by one is reported."""
    path = tmp_path / "masked.py"
    path.write_text("import torch\n\n\ndef f():\n    from .policy import PolicyLoss\n"
                    "    import areal_trainer.config.keys\n    return PolicyLoss\n")
    assert imports("loss.masked", str(path)) >= {"loss.policy", "config.keys"}
    with pytest.raises(AssertionError, match="import cycle: loss.masked -> loss.policy -> loss.masked"):
        assert_acyclic({"loss.masked": {"loss.policy"}, "loss.policy": {"loss.masked", "loss.types"},
                        "loss.types": set()})
    assert_acyclic({"loss": {"loss.policy"}, "loss.policy": {"loss"}})  # a package and its own module


def assert_acyclic(graph: dict[str, set[str]]) -> None:
    """Fail naming the first import cycle of ``graph`` (module -> the modules it imports)."""
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt == node or nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own submodules
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, nxt]))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def test_one_did_you_mean():
    """Every suggestion for a misspelt name (keys, choices, plugin attributes) comes from ``errors.closest``."""
    users = sorted(n for n, p in MODULES.items() if n != "errors" and "difflib" in open(p).read())
    assert not users, f"{users} compute their own close matches; call errors.closest / errors.suggest"
