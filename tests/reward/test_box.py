"""The box's plumbing: plain data on the wire, the judge's handles, what is in force at start-up, and
code rewards refusing to start where the kernel refuses the namespaces (as a container runtime does)."""

import logging
import math
import platform
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_trainer.reward import code
from areal_trainer.reward.box import wire
from areal_trainer.reward.code import run_tests, startup_problems, unit_tests

from ..isolation import needs_isolation

SOLUTION = "def f(x):\n    return 3 * x + 2\n"
LINUX = sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64")

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary() | \
    st.complex_numbers(allow_nan=False)
hashable = st.recursive(scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=8)
plain = st.recursive(hashable, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hashable, inner, max_size=3)
                     | st.sets(hashable, max_size=3), max_leaves=12)


def exact(a, b) -> bool:
    """Equal and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(exact(a[k], b[k]) for k in a)
    return a == b


def no_handles(value):
    raise TypeError(type(value).__name__)


@given(plain)
def test_plain_data_crosses_the_wire_unchanged(value):
    line = wire.dumps({"ok": wire.encode(value, no_handles)})
    assert exact(wire.decode(wire.loads(line)["ok"], None), value)


def test_special_floats_and_handles_cross_the_wire():
    encoded = wire.encode([math.inf, -math.inf, math.nan, print], lambda v: {"h": 7})
    decoded = wire.decode(wire.loads(wire.dumps({"v": encoded}))["v"], lambda i: ("handle", i))
    assert decoded[:2] == [math.inf, -math.inf] and math.isnan(decoded[2]) and decoded[3] == ("handle", 7)


@pytest.mark.parametrize("bad", [{"list": 3}, {"dict": [[{"list": []}, 1]]}, {"float": "1"}, {"h": "0"},
                                 {"complex": [1, 2]}, {"bytes": "zz"}, [1, 2], {"a": 1, "b": 2}])
def test_the_judge_decodes_nothing_but_plain_data(bad):
    with pytest.raises(wire.WireError):
        wire.decode(bad, lambda i: i)


def test_a_line_longer_than_the_limit_is_refused():
    lines = wire.Lines(-1)
    lines.feed(b"x" * (wire.MAX_MESSAGE_BYTES + 1))
    with pytest.raises(wire.WireError, match="longer than"):
        lines.pending()


@needs_isolation
def test_handles_compare_by_identity_and_have_no_truth_value():
    body = "class P:\n    def __eq__(self, o):\n        return True\n    def __bool__(self):\n        return True\n" \
           "def p():\n    return P()\ndef same():\n    return P.singleton\nP.singleton = P()\n"
    tests = ["a = p()\nassert a == a and a != p()", "assert same() == same()", "assert p()", "assert p() == 1",
             "assert not (p() == p())", "assert [p()] != [p()]"]
    assert run_tests(body, tests, timeout=5, memory_mb=512) == [True, False, False, False, True, True]


@needs_isolation
def test_solution_objects_are_usable_through_their_handles():
    body = ("class Box:\n    def __init__(self):\n        self.items = {}\n    def __len__(self):\n"
            "        return len(self.items)\n    def __str__(self):\n        return 'Box'\n"
            "    def __getitem__(self, k):\n        return self.items[k]\n    def __setitem__(self, k, v):\n"
            "        self.items[k] = v\ndef gen(n):\n    yield from range(n)\nimport numpy_missing_is_fine" "\n")
    assert run_tests(body, ["assert True"], timeout=5, memory_mb=512) == [False]  # the import fails: no test runs
    body = body.replace("import numpy_missing_is_fine", "import math")
    tests = ["b = Box(); b['k'] = 3; assert b['k'] == 3 and len(b) == 1 and str(b) == 'Box'",
             "assert list(gen(3)) == [0, 1, 2] and sorted(gen(2)) == [0, 1]", "assert math.floor(2.5) == 2",
             "b = Box(); b.items = {'x': 1}; assert b.items == {'x': 1}"]
    assert run_tests(body, tests, timeout=5, memory_mb=512) == [True] * 4


@needs_isolation
def test_builtins_in_tests_stay_the_builtins():
    body = "def sorted(x):\n    return [1, 2, 3]\ndef f(x):\n    return x\n"
    assert run_tests(body, ["assert sorted(f([3, 2])) == [2, 3]", "assert sorted(f([3, 2])) == [1, 2, 3]"],
                     timeout=5, memory_mb=512) == [True, False]


@needs_isolation
def test_an_exception_the_code_raises_is_the_builtin_one_and_a_dead_box_is_none():
    body = "import os\ndef f(x):\n    if x < 0:\n        raise KeyError(x)\n    os._exit(0)\n"
    expect = "try:\n    f({x})\nexcept Exception:\n    pass\nelse:\n    raise AssertionError"
    assert run_tests(body, [expect.format(x=-1), expect.format(x=1), expect.format(x=-1)], timeout=5,
                     memory_mb=512) == [True, False, False]


@needs_isolation
def test_start_up_names_what_is_in_force_once(caplog):
    code._warned.clear()
    with caplog.at_level(logging.INFO, logger="areal_trainer.reward.code"):
        assert startup_problems({}) == [] and startup_problems({"timeout": 2}) == []
        assert startup_problems({"isolation": "off"}) == []
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("sandbox: namespaces+seccomp") for m in lines) == 1
    assert sum(m.startswith("sandbox: limits+seccomp (isolation=off") for m in lines) == 1
    assert any("isolation=off on a machine that can isolate" in m and "Remove the key" in m for m in lines)


def test_bad_kwargs_are_start_up_problems():
    assert startup_problems({"isolation": "docker"}) == [
        "reward.kwargs.isolation: got 'docker'; give one of auto, off (default auto: namespaces; off: limits and "
        "seccomp only)."]
    with pytest.raises(code.UserError, match="isolation"):
        unit_tests("p", SOLUTION, "", tests=["assert f(1) == 5"], isolation="none")


# What a container runtime's default seccomp profile does to the box: unshare is refused (EPERM).
REFUSING = """
import ctypes, platform
from areal_trainer.reward.code import startup_problems, unit_tests
arch = platform.machine().lower()
nr, audit = (272, 0xC000003E) if arch in ("x86_64", "amd64") else (97, 0xC00000B7)
prog = [(0x20, 0, 0, 0), (0x15, 0, 1, nr), (0x06, 0, 0, 0x00050000 | 1), (0x06, 0, 0, 0x7FFF0000)]
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
fs = (F * len(prog))(*[F(*i) for i in prog])
libc = ctypes.CDLL(None)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
assert libc.prctl(38, 1, None, 0, 0) == 0 and libc.prctl(22, 2, ctypes.addressof(P(len(prog), fs)), 0, 0) == 0
print(startup_problems({}, key="reward.fn[1]"))
print(startup_problems({"isolation": "off"}))
print(unit_tests("p", "def f(x):\\n    return 3 * x + 2\\n", "", tests=["assert f(1) == 5"], isolation="off"))
"""


@pytest.mark.skipif(not LINUX, reason="the box's namespaces and seccomp are Linux x86-64/arm64")
def test_where_the_kernel_refuses_namespaces_code_rewards_refuse_to_start():
    out = subprocess.run([sys.executable, "-c", REFUSING], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    refused, off, score = out.stdout.splitlines()
    assert "reward.fn[1] (unit_tests): generated code cannot be isolated on this machine" in refused
    assert "unshare(user, mount, pid, net, ipc, uts namespaces): Operation not permitted" in refused
    assert "set reward.kwargs.isolation=off" in refused
    assert off == "[]" and score == "1.0"
    assert "isolation=off on a machine that can isolate" not in out.stderr  # nothing is given up there
