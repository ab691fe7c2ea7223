"""A reward for generated Python code: the fraction of a row's unit tests that pass.

:func:`unit_tests` takes the last fenced code block of the completion (see :func:`extract_code`),
runs it in a box (a sandboxed child process, ``box/``), then runs each test (an ``assert`` statement)
in the judge (``judge.py``), which calls into the box for the solution's functions and objects, and
returns ``passed / len(tests)``. The code runs with ``__name__ == "__solution__"``, so an ``if
__name__ == "__main__":`` demo block does not run. Code that does not run scores 0.0; a test that
raises, fails or does not finish in time counts as failed. Nothing the code does makes the reward
raise: loops, huge allocations, fork bombs, network access and crashes all end as failed tests. Bad
inputs from the configuration or the data (no tests, a non-positive timeout) raise a ``UserError``,
and a box that cannot set itself up raises ``RuntimeError``, so the reward runner reports them
instead of the run training on silent zeros; :func:`startup_problems` finds that before any model loads.

The box
-------
A fresh interpreter, ``sys.executable -I -B`` running ``box/child.py`` as a script (never a ``fork`` of
the trainer, which has torch threads; ``-I``: no ``PYTHON*`` variables, no user site directory), in a new
session and process group, with stdin/stdout/stderr on ``/dev/null``, no inherited file descriptors but
its two pipes, and an environment of ``PATH``, a UTF-8 locale, ``HOME`` and ``TMPDIR`` (``/tmp``) and one
BLAS/OpenMP thread: no variable of the trainer's. Before the code runs it locks itself in:

* ``isolation=auto`` (the default): its own user, mount, PID, IPC, UTS and network namespaces
  (``box/namespaces.py``). It sees the system directories and the Python environment read-only, an empty
  64 MiB ``/tmp`` as its only writable place (gone with it), its own ``/proc`` with no other process, no
  ``/etc``, home, checkout or checkpoint, only ``/dev/null``, ``zero``, ``random``, ``urandom``, and no
  network. Where the kernel refuses the namespaces (no unprivileged user namespaces; a container
  runtime's seccomp profile), a Landlock box instead (``box/landlock.py``, Linux >= 5.13): the same
  files readable, its scratch directory (private to the call, watched to the same 64 MiB and 4096
  entries by ``keeper.py``) as its only writable place, no ``/proc`` at all, no capabilities, no TCP,
  no signal out of it. Where neither can be set up, code rewards refuse to start, saying what failed.
* ``isolation=namespaces`` or ``landlock``: that box only (an error where the kernel refuses it).
* ``isolation=off``: only what follows, which runs in every case. The code then runs as the trainer's
  user and sees its files: only for a machine with nothing to protect.
* Resource limits (memory ``memory_mb``, CPU time, no new processes, file sizes and counts), a seccomp
  filter with which the kernel refuses processes, threads, ``exec``, sockets, signals to other processes,
  mounts and namespaces, also as root, and the same blocks at the Python level (``box/seccomp.py``).

The judge waits at most ``timeout`` seconds in all (wall clock, including the ~0.05 s start), then
SIGKILLs the box's process group, always, and reaps it: no zombie, no leftover process, no leftover
scratch directory. The tests never run in the box, and everything the box sends is decoded as plain data
(``judge.py``), so code written against this harness (patched builtins, an ``__eq__`` that is always
true, an early exit with success, forged lines on any file descriptor) scores 0 on the tests it does not
pass. What the box cannot bound: the code's CPU use per call is bounded by ``timeout``, not by tests."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time

from ..errors import UserError
from ..failures import CODE_TIMEOUT
from . import completion_text, judge, keeper
from .box import wire

logger = logging.getLogger(__name__)

MIN_MEMORY_MB = 64
"""The smallest ``memory_mb`` accepted: below it the interpreter itself cannot run."""
ISOLATION = ("auto", "namespaces", "landlock", "off")
"""The values of ``isolation`` (see the module docstring)."""
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "box", "child.py")
"""The box's script, run by path: a script, not a module of the package."""
_PYTHON_TAGS = {"", "python", "py", "python3"}
_warned: set[str] = set()


def unit_tests(prompt, completion, answer, *, tests=None, timeout: float = CODE_TIMEOUT, memory_mb: int = 512,
               isolation: str = "auto", **fields) -> float:
    """Fraction of ``tests`` (the row's column; ``answer`` when it has none) that pass after the
    completion's code (a conversational completion: its last message's); see the module docstring.
    ``prompt`` and other row fields are ignored."""
    test_list = split_tests(answer if tests is None else tests, "tests" if tests is not None else "answer")
    _check_limits(timeout, memory_mb, isolation)
    passed = run_tests(extract_code(completion_text(completion)), test_list, timeout=float(timeout),
                       memory_mb=int(memory_mb), isolation=isolation)
    return sum(passed) / len(test_list)


unit_tests.verdict = "all_or_nothing"  # partial credit: an answer is correct only when every test passes


def extract_code(completion: str) -> str:
    """The last fenced code block tagged ``python``/``py``/``python3`` or untagged, dedented; a block
    left open at the end (a completion cut off by the token limit) counts. A closing fence may end a
    line of code. Without any such block: the whole completion."""
    blocks, lang, lines = [], None, []
    for line in completion.splitlines():
        stripped = line.strip()
        if lang is None:
            if stripped.startswith("```"):
                lang, lines = stripped[3:].strip().lower(), []
        elif stripped == "```" or stripped.endswith("```"):
            if stripped != "```":
                lines.append(line.rstrip()[:-3])
            blocks.append((lang, lines))
            lang = None
        else:
            lines.append(line)
    if lang is not None:
        blocks.append((lang, lines))
    python = [b for tag, b in blocks if tag in _PYTHON_TAGS]
    return textwrap.dedent("\n".join(python[-1])) if python else completion


def split_tests(tests, column: str = "tests") -> list[str]:
    """A list of test statements from a list (or any sequence) of strings, or from one string with
    one statement per line (blank and ``#`` comment lines dropped)."""
    if isinstance(tests, str):
        out = [t for t in tests.splitlines() if t.strip() and not t.strip().startswith("#")]
    elif tests is not None and not isinstance(tests, (bytes, dict)) and hasattr(tests, "__iter__"):
        out = [str(t) for t in tests if str(t).strip()]
    else:
        out = None
    if not out:
        raise UserError(
            f"reward: the row's {column!r} column is {tests!r:.100}; unit_tests needs the tests of each row as a "
            "list of assert statements or one string with one assert per line. Add a 'tests' column to the "
            "dataset (or put the tests in 'answer').")
    return out


def run_tests(code: str, tests: list[str], *, timeout: float, memory_mb: int, isolation: str = "auto",
              in_force: dict | None = None) -> list[bool]:
    """Whether each test passed after ``code`` run in a box (see the module docstring). Raises
    ``RuntimeError`` when the box cannot set itself up. ``in_force`` receives the box's ``ready`` message
    (``{"ready": "namespaces", "landlock" or "off", "seccomp": "on" or why not}``, and for Landlock its
    ABI version and why the namespaces were refused)."""
    scratch = tempfile.mkdtemp(prefix="areal_code_")  # mode 0700; the code's own but in the namespace box (a tmpfs)
    deadline = time.monotonic() + timeout
    request_r, request_w = os.pipe()
    answer_r, answer_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", CHILD, str(request_r), str(answer_w), str(os.getpid())],
            cwd=scratch, env=_child_env("/tmp" if isolation in ("auto", "namespaces") else scratch),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(request_r, answer_w), start_new_session=True)
        for fd in (request_r, answer_w):
            os.close(fd)
        request_r = answer_w = -1
        watchdog = None
        try:
            box = judge.Box(request_w, answer_r, deadline)
            os.write(request_w, wire.dumps({"code": code, "memory_mb": memory_mb, "cpu_s": math.ceil(timeout) + 1,
                                            "isolation": isolation}))
            ready = _ready(box, timeout, {} if in_force is None else in_force)
            if ready == "landlock":  # before the code runs: nothing bounds its scratch directory but this
                watchdog = keeper.Watchdog(scratch, proc.pid)
            names = _loaded(box) if ready else None
            passed = [False] * len(tests) if names is None else judge.run_tests(box, names, tests)
        finally:
            if watchdog is not None:
                watchdog.stop()
            keeper.kill_group(proc)
        if watchdog is not None and watchdog.reason:
            _warn_once(f"unit_tests: a Landlock box was killed: {watchdog.reason}; the tests it had not passed "
                       "failed.")
    finally:
        for fd in (request_r, request_w, answer_r, answer_w):
            if fd >= 0:
                os.close(fd)
        if not keeper.remove_tree(scratch):
            _warn_once(f"unit_tests: could not delete the scratch directory {scratch}")
    return passed


def _ready(box: judge.Box, timeout: float, in_force: dict) -> str | None:
    """What the box has in force once it is set up (``namespaces``, ``landlock``, ``off``); None when it
    did not get there in time (warned once). Raises ``RuntimeError`` for a box that could not set up."""
    try:
        ready = box.receive()
    except judge.BoxGone:
        _warn_once(f"unit_tests: a sandbox did not start within timeout={timeout}s (a busy machine?); its sample "
                   "scored 0.0. Raise reward.kwargs.timeout if this repeats.")
        return None
    in_force.update(ready)
    if "setup-error" in ready:
        raise RuntimeError(f"unit_tests: the sandbox could not set itself up before running the code: "
                           f"{ready['setup-error']}")
    if ready.get("seccomp") != "on":
        _warn_once(f"unit_tests: the seccomp filter could not be installed ({ready.get('seccomp')}); the code "
                   "runs without it (see areal_trainer/reward/code.py).")
    return str(ready.get("ready"))


def _loaded(box: judge.Box):
    """The names the code defined (the box's ``loaded`` message); None when it raised or ran out of time."""
    try:
        return box.receive().get("loaded")
    except judge.BoxGone:
        return None


def startup_problems(kwargs: dict, *, key: str = "reward.fn") -> list[str]:
    """The problems of running code rewards with ``kwargs`` (``reward.kwargs``) on this machine, found by
    running one trivial program in a box, before any model loads: bad limits, or a box that cannot isolate
    (with what failed and the opt-out key). Logs once what is in force (``sandbox: namespaces+seccomp``,
    ``sandbox: landlock+seccomp``); ``isolation=off`` where isolation works is a warning naming what is
    given up."""
    timeout, memory_mb = kwargs.get("timeout", CODE_TIMEOUT), kwargs.get("memory_mb", 512)
    isolation = kwargs.get("isolation", "auto")
    try:
        _check_limits(timeout, memory_mb, isolation)
    except UserError as e:
        return [str(e)]
    found = _probe(int(memory_mb), "auto" if isolation == "off" else isolation)
    if isolation != "off":
        if "error" in found:
            return [_refusal(key, isolation, found["error"])]
        _note_once(_in_force(found, isolation))
    else:
        if "error" not in found:
            _warn_once(f"{key}: reward.kwargs.isolation=off on a machine that can isolate generated code: it runs "
                       "as the trainer's user and can read and write that user's files (checkpoints, credentials, "
                       "the Python environment), see other processes in /proc and read their environment. Remove "
                       "the key to isolate it.")
        _note_once(f"sandbox: limits+{_seccomp_word(found)} (isolation=off: no namespaces)")
    return []


unit_tests.startup_check = startup_problems  # RewardFunction.startup_problems calls it before any model loads
_probes: dict[tuple[int, str], dict] = {}
_NEEDS = {"namespaces": "unprivileged user namespaces (or root), which a container runtime's default seccomp profile "
                        "or the sysctls kernel.unprivileged_userns_clone=0 / user.max_user_namespaces=0 refuse",
          "landlock": "Landlock: Linux >= 5.13 with landlock among the LSMs (the lsm= boot parameter), and a "
                      "container runtime that allows its system calls"}


def _refusal(key: str, isolation: str, why: str) -> str:
    """The start-up error where the box asked for cannot be set up: what failed, what it needs, the way out."""
    off = ("set reward.kwargs.isolation=off to run the code with resource limits and seccomp only: it can then "
           "read and write whatever the trainer's user can")
    if isolation == "auto":
        return (f"{key} (unit_tests): generated code cannot be isolated on this machine: {why}. The box needs "
                f"{_NEEDS['namespaces']}; or else {_NEEDS['landlock']}. Run where either is allowed (e.g. docker "
                f"--security-opt seccomp=unconfined), or {off}.")
    other = "a Landlock box" if isolation == "namespaces" else "namespaces"
    return (f"{key} (unit_tests): reward.kwargs.isolation={isolation}, which this machine refuses: {why}. It needs "
            f"{_NEEDS[isolation]}. Remove the key (auto) to use {other} where the kernel allows them, or {off}.")


def _in_force(found: dict, isolation: str) -> str:
    """The run log's line naming the box in force (``found``: its ``ready`` message)."""
    if found.get("ready") == "namespaces":
        return (f"sandbox: namespaces+{_seccomp_word(found)} (own user, mount, PID, IPC, UTS and network "
                "namespaces; read-only system and Python environment; a private 64 MiB /tmp; no network)")
    abi = int(found.get("landlock", 0))
    why = "isolation=landlock" if isolation == "landlock" else f"namespaces refused: {found.get('namespaces')}"
    tcp = ", TCP by Landlock too" if abi >= 4 else ""
    scoped = "or abstract socket " if abi >= 6 else ""
    return (f"sandbox: landlock+{_seccomp_word(found)} ({why}; Landlock ABI {abi}: read-only system and Python "
            "environment; a private scratch directory, watched to 64 MiB and 4096 entries; no /etc, /proc or "
            f"home; no capabilities; no network (sockets refused by seccomp{tcp}); no signal {scoped}out of the box)")


def _probe(memory_mb: int, isolation: str = "auto") -> dict:
    """What a box of ``isolation`` reports on this machine (its ``ready`` message, or ``{"error": why}``), once."""
    if (memory_mb, isolation) not in _probes:
        in_force: dict = {}
        try:
            run_tests("def f():\n    return 1\n", ["assert f() == 1"], timeout=30.0, memory_mb=memory_mb,
                      isolation=isolation, in_force=in_force)
        except RuntimeError:
            in_force = {"error": in_force.get("setup-error", "the box could not set itself up")}
        _probes[memory_mb, isolation] = in_force
    return _probes[memory_mb, isolation]


def _seccomp_word(found: dict) -> str:
    return "seccomp" if found.get("seccomp", "on") == "on" else f"no seccomp ({found.get('seccomp')})"


def _check_limits(timeout, memory_mb, isolation="auto") -> None:
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise UserError(f"reward.kwargs.timeout: got {timeout!r}; give the seconds each program may run, "
                          "a number > 0 (default 5).")
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < MIN_MEMORY_MB:
        raise UserError(f"reward.kwargs.memory_mb: got {memory_mb!r}; give the address-space limit in MiB, "
                          f"an integer >= {MIN_MEMORY_MB} (default 512).")
    if isolation not in ISOLATION:
        raise UserError(f"reward.kwargs.isolation: got {isolation!r}; give one of {', '.join(ISOLATION)} "
                        "(default auto: namespaces, else Landlock; off: limits and seccomp only).")


def _child_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home,
            "TMPDIR": home, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _note_once(message: str) -> None:
    _once(logging.INFO, message)


def _warn_once(message: str) -> None:
    _once(logging.WARNING, message)


def _once(level: int, message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.log(level, message)
