"""The box's plumbing: plain data on the wire, the judge's handles, what is in force at start-up, the
Landlock box taking over where the kernel refuses the namespaces (as a container runtime does), and code
rewards refusing to start where it refuses both."""

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

from ..isolation import needs_isolation, needs_landlock, needs_namespaces

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


@needs_namespaces
@needs_landlock
def test_start_up_names_what_is_in_force_once(caplog):
    code._warned.clear()
    with caplog.at_level(logging.INFO, logger="areal_trainer.reward.code"):
        assert startup_problems({}) == [] and startup_problems({"timeout": 2}) == []
        assert startup_problems({"isolation": "namespaces"}) == []
        assert startup_problems({"isolation": "landlock"}) == startup_problems({"isolation": "landlock"}) == []
        assert startup_problems({"isolation": "off"}) == []
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("sandbox: namespaces+seccomp (own user, mount, PID") for m in lines) == 1
    assert sum(m.startswith("sandbox: landlock+seccomp (isolation=landlock; Landlock ABI ") for m in lines) == 1
    assert sum(m.startswith("sandbox: limits+seccomp (isolation=off") for m in lines) == 1
    assert any("isolation=off on a machine that can isolate" in m and "Remove the key" in m for m in lines)


def test_bad_kwargs_are_start_up_problems():
    assert startup_problems({"isolation": "docker"}) == [
        "reward.kwargs.isolation: got 'docker'; give one of auto, namespaces, landlock, off (default auto: "
        "namespaces, else Landlock; off: limits and seccomp only)."]
    with pytest.raises(code.UserError, match="isolation"):
        unit_tests("p", SOLUTION, "", tests=["assert f(1) == 5"], isolation="none")


# What a container runtime's default seccomp profile does to the box: unshare is refused (EPERM); and a
# kernel without Landlock too (landlock_create_ruleset refused, as a profile that predates it does).
REFUSING = """
import ctypes, logging, platform, sys
from areal_trainer.reward.code import startup_problems, unit_tests
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="log: %(message)s")
arch = platform.machine().lower()
unshare = 272 if arch in ("x86_64", "amd64") else 97
prog = [(0x20, 0, 0, 0)]
for nr in [unshare] + ([444] if sys.argv[1] == "both" else []):
    prog += [(0x15, 0, 1, nr), (0x06, 0, 0, 0x00050000 | 1)]
prog += [(0x06, 0, 0, 0x7FFF0000)]
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
fs = (F * len(prog))(*[F(*i) for i in prog])
libc = ctypes.CDLL(None)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
assert libc.prctl(38, 1, None, 0, 0) == 0 and libc.prctl(22, 2, ctypes.addressof(P(len(prog), fs)), 0, 0) == 0
print(repr(startup_problems({}, key="reward.fn[1]")))
print(repr(startup_problems({"isolation": "namespaces"})))
print(repr(startup_problems({"isolation": "off"})))
print(unit_tests("p", "def f(x):\\n    return 3 * x + 2\\n", "", tests=["assert f(1) == 5"], isolation="off"))
try:
    print(unit_tests("p", "def f(x):\\n    return 3 * x + 2\\n", "", tests=["assert f(1) == 5"]))
except RuntimeError:
    print(None)
"""
REFUSED_NAMESPACES = "unshare(user, mount, pid, net, ipc, uts namespaces): Operation not permitted"


def refusing(which: str) -> tuple[list, str]:
    """The lines the script above prints (each a Python literal) and its log, the kernel refusing ``which``."""
    out = subprocess.run([sys.executable, "-c", REFUSING, which], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    log = "\n".join(line for line in out.stdout.splitlines() if line.startswith("log: "))
    return [eval(line) for line in out.stdout.splitlines() if not line.startswith("log: ")], log


@pytest.mark.skipif(not LINUX, reason="the box's namespaces and seccomp are Linux x86-64/arm64")
@needs_landlock
def test_where_the_kernel_refuses_namespaces_auto_takes_the_landlock_box():
    (auto, namespaces, off, score_off, score), log = refusing("namespaces")
    assert auto == [] and off == [] and score_off == score == 1.0
    in_force = [line for line in log.splitlines() if line.startswith("log: sandbox: landlock+seccomp")]
    assert len(in_force) == 1 and f"(namespaces refused: IsolationError: [Errno 1] {REFUSED_NAMESPACES}; " \
        "Landlock ABI " in in_force[0], log
    assert "sandbox: namespaces" not in log
    assert namespaces == [f"reward.fn (unit_tests): reward.kwargs.isolation=namespaces, which this machine refuses: "
                          f"IsolationError: [Errno 1] {REFUSED_NAMESPACES}. It needs unprivileged user namespaces "
                          "(or root), which a container runtime's default seccomp profile or the sysctls "
                          "kernel.unprivileged_userns_clone=0 / user.max_user_namespaces=0 refuse. Remove the key "
                          "(auto) to use a Landlock box where the kernel allows them, or set "
                          "reward.kwargs.isolation=off to run the code with resource limits and seccomp only: it "
                          "can then read and write whatever the trainer's user can."]
    assert "isolation=off on a machine that can isolate" in log  # the Landlock box was given up


@pytest.mark.skipif(not LINUX, reason="the box's namespaces and seccomp are Linux x86-64/arm64")
def test_where_the_kernel_refuses_namespaces_and_landlock_code_rewards_refuse_to_start():
    (auto, namespaces, off, score_off, score), log = refusing("both")
    assert len(auto) == 1 and auto[0].startswith(
        "reward.fn[1] (unit_tests): generated code cannot be isolated on this machine: Refused: namespaces: "
        f"IsolationError: [Errno 1] {REFUSED_NAMESPACES}; Landlock: LandlockError: [Errno 1] "
        "landlock_create_ruleset: Operation not permitted. The box needs unprivileged user namespaces")
    assert "or else Landlock: Linux >= 5.13" in auto[0] and "set reward.kwargs.isolation=off" in auto[0]
    assert len(namespaces) == 1 and REFUSED_NAMESPACES in namespaces[0]
    assert off == [] and score_off == 1.0 and score is None
    assert "isolation=off on a machine that can isolate" not in log  # nothing is given up there
