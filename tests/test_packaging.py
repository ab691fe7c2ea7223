"""pyproject lists every package (conf/ is installed as areal_trainer.conf, so the list is explicit)."""

import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_package_is_listed():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {"areal_trainer.conf"}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "areal_trainer")):
        if "__init__.py" in files:
            found.add(os.path.relpath(dirpath, ROOT).replace(os.sep, "."))
    assert listed == found
