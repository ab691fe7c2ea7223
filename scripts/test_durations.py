"""Write ``tests/durations.json``, each test file's seconds in a run of the suite, from that run's JUnit XML.

``tests/conftest.py`` runs the files longest first, and ``scripts/test.sh`` hands them to its two pytest-xdist
workers in that order (``--no-loadscope-reorder``; xdist's default puts the files with the most tests first):
the long end-to-end files start at once instead of leaving one worker alone with one of them at the end.

    .venv/bin/python -m pytest -m "not slow and not learning" -n 2 --dist loadfile --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/test_durations.py /tmp/suite.xml

Refresh it when files are added or their tests change much; a file it does not name counts as
``conftest.UNMEASURED`` seconds (end-to-end) or none.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "durations.json")


def file_seconds(junit_xml: str) -> dict[str, float]:
    """Seconds per test file (``tests/...py``), setup and teardown included, longest first."""
    seconds: dict[str, float] = collections.Counter()
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "").split("::")[0]
        # classname is dotted (tests.e2e.test_x, or tests.e2e.test_x.TestClass): the module's file
        parts = module.split(".")
        while parts and not os.path.isfile(os.path.join(ROOT, *parts[:-1], parts[-1] + ".py")):
            parts.pop()
        if parts:
            seconds["/".join(parts) + ".py"] += float(case.get("time", 0))
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("junit_xml")
    args = p.parse_args()
    seconds = file_seconds(args.junit_xml)
    with open(OUT, "w") as f:
        json.dump(seconds, f, indent=0)
        f.write("\n")
    print(f"{OUT}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all; longest: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in list(seconds.items())[:5]))


if __name__ == "__main__":
    main()
