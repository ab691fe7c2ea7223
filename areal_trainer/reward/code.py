"""A reward for generated Python code: the fraction of a row's unit tests that pass.

:func:`unit_tests` takes the last fenced code block of the completion (see :func:`extract_code`),
runs it in a sandboxed child process, then runs each test (an ``assert`` statement) after it in the
same interpreter and namespace, and returns ``passed / len(tests)``. The code runs with
``__name__ == "__solution__"``, so an ``if __name__ == "__main__":`` demo block does not run. Code
that does not run scores 0.0; a test that raises, fails or does not finish in time counts as
failed. Nothing the code does makes the reward raise: loops, huge allocations, fork bombs, network
access and crashes all end as failed tests. Bad inputs from the configuration or the data (no
tests, a non-positive timeout) raise a ``UserError``, and a sandbox that cannot set itself up (a
broken environment) raises ``RuntimeError``, so the reward runner reports them instead of the run
training on silent zeros.

The child
---------
A fresh interpreter, ``sys.executable -I -B`` running :mod:`areal_trainer.reward.sandbox` as a
script (never a ``fork`` of the trainer, which has torch threads; ``-I``: no ``PYTHON*`` variables, no
user site directory, neither the script's nor the working directory on ``sys.path``; the
environment's installed packages stay importable). It runs in a new session and process group, in a
new temporary directory (deleted afterwards) as its working directory, with stdin/stdout/stderr on
``/dev/null``, no inherited file descriptors but the pipe it reports on, and a minimal environment
(``PATH``, a UTF-8 locale, ``HOME`` and ``TMPDIR`` set to the scratch directory, one BLAS/OpenMP
thread). Before the code runs, it locks itself in (the steps are listed in
:mod:`~areal_trainer.reward.sandbox`): it dies with the process that started it; it gets resource
limits (memory ``memory_mb``, CPU time, no new processes, file sizes and counts); a seccomp filter
makes the kernel refuse it processes, threads, ``exec``, sockets and signals to other processes,
also as root; and the Python-level entry points of the same raise ``PermissionError``.

The parent waits at most ``timeout`` seconds (wall clock, including the ~0.05 s interpreter start-up),
then SIGKILLs the whole process group, always, and reaps the child: no zombie, no leftover process
(the child cannot create any), no leftover scratch directory. Results come back over a pipe as lines
tagged with a random per-run token, read up to 1 MiB, so printed or written fake results do not
count and the code cannot flood the trainer's memory. Only a caller killed mid-call (its sandbox
dies with it, see above) leaves its scratch directory behind.

What is NOT isolated
--------------------
This is not a container. The code runs as the trainer's user (root if the trainer is root) and sees
the same filesystem: it can read every file that user can read (datasets, checkpoints, credentials
in the home directory) and write or delete every file that user can write, outside the scratch
directory too; total disk use is not bounded, only each file's size. Through ``/proc`` it can read
about other processes and, being the same user, open the trainer's ``/proc/<pid>/mem``. The memory
limit is on address space, not resident memory. Where seccomp cannot be installed (other
architectures, kernels without it; a warning is logged once), only the Python-level blocks stand
between the code and the network, and code that calls libc through ``ctypes`` gets past them (as
root it could then also start processes). Finally, the tests run in the same interpreter as the
code, so a program written against this harness (patching builtins, an ``__eq__`` that is always
true, reading the report token from the harness' frames) can fake passing tests: the sandbox
protects the machine, not the reward from reward hacking, and it is meant for model-generated code,
not as a security boundary against people trying to break out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

from ..errors import UserError
from . import completion_text, sandbox

logger = logging.getLogger(__name__)

MAX_REPORT_BYTES = 1 << 20
"""Most bytes of the child's report that the parent reads (a test adds about 40)."""
MIN_MEMORY_MB = 64
"""The smallest ``memory_mb`` accepted: below it the interpreter itself cannot run."""
_PYTHON_TAGS = {"", "python", "py", "python3"}
_POLL_S = 0.005
_warned: set[str] = set()


def unit_tests(prompt, completion, answer, *, tests=None, timeout: float = 5.0, memory_mb: int = 512,
               **fields) -> float:
    """Fraction of ``tests`` (the row's column; ``answer`` when it has none) that pass after the
    completion's code (a conversational completion: its last message's); see the module docstring.
    ``prompt`` and other row fields are ignored."""
    test_list = split_tests(answer if tests is None else tests, "tests" if tests is not None else "answer")
    _check_limits(timeout, memory_mb)
    passed = run_tests(extract_code(completion_text(completion)), test_list, timeout=float(timeout),
                       memory_mb=int(memory_mb))
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


def run_tests(code: str, tests: list[str], *, timeout: float, memory_mb: int) -> list[bool]:
    """Whether each test passed after ``code``, run in the sandboxed child (see the module docstring)."""
    nonce = secrets.token_hex(16)
    scratch = tempfile.mkdtemp(prefix="areal_code_")
    read_fd, write_fd = os.pipe()
    try:
        with open(os.path.join(scratch, sandbox.PAYLOAD), "w", encoding="utf-8") as f:
            json.dump({"code": code, "tests": tests, "nonce": nonce, "memory_mb": memory_mb,
                       "cpu_s": math.ceil(timeout) + 1}, f)
        script = os.path.abspath(sandbox.__file__)  # run by path: a script, not a module of the package
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", script, str(write_fd), str(os.getpid())],
            cwd=scratch, env=_child_env(scratch), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        write_fd = -1
        try:
            report = _read_report(read_fd, time.monotonic() + timeout, proc.pid)
        finally:
            _kill_group(proc)
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        _remove_tree(scratch)
    return _parse_report(report, nonce, len(tests), timeout)


def _check_limits(timeout, memory_mb) -> None:
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise UserError(f"reward.kwargs.timeout: got {timeout!r}; give the seconds each program may run, "
                          "a number > 0 (default 5).")
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < MIN_MEMORY_MB:
        raise UserError(f"reward.kwargs.memory_mb: got {memory_mb!r}; give the address-space limit in MiB, "
                          f"an integer >= {MIN_MEMORY_MB} (default 512).")


def _child_env(scratch: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": scratch,
            "TMPDIR": scratch, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _read_report(fd: int, deadline: float, pid: int) -> bytes:
    """The child's report: read until it closes the pipe, ``MAX_REPORT_BYTES`` or the deadline;
    then wait (without reaping) for it to exit, at most until the deadline."""
    chunks, size = [], 0
    while size < MAX_REPORT_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    # WNOWAIT leaves the exited child a zombie, so its pid still names its process group for the kill.
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            break
        time.sleep(_POLL_S)
    return b"".join(chunks)[:MAX_REPORT_BYTES]


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (it may still run, or have left members), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _remove_tree(path: str) -> None:
    """Delete the scratch directory, also where the code took permissions away from what it made."""
    for root, dirs, _files in os.walk(path):  # top-down: each directory is opened up before the walk enters it
        for name in dirs:
            sub = os.path.join(root, name)
            if not os.path.islink(sub):  # chmod follows links: never touch what a link points to
                with contextlib.suppress(OSError):
                    os.chmod(sub, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        _warn_once(f"unit_tests: could not delete the scratch directory {path}")


def _parse_report(report: bytes, nonce: str, n_tests: int, timeout: float) -> list[bool]:
    """Passed tests from the report lines ``<nonce> <kind> <value>``; a sandbox that failed to set
    itself up raises (every sample would score 0.0), one that did not start in time warns once."""
    passed, ready = [False] * n_tests, False
    for line in report.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[0] != nonce:
            continue
        kind, value = parts[1], parts[2]
        if kind == "pass" and value.isdigit() and int(value) < n_tests:
            passed[int(value)] = True
        elif kind == "ready":
            ready = True
            if value != "on":
                _warn_once(f"unit_tests: the seccomp filter could not be installed ({value}); the code runs "
                           "with resource limits and Python-level blocks only (see areal_trainer/reward/code.py).")
        elif kind == "setup-error":
            raise RuntimeError(f"unit_tests: the sandbox could not set itself up before running the code: {value}")
    if not ready:
        _warn_once(f"unit_tests: a sandbox did not start within timeout={timeout}s (a busy machine?); its sample "
                   "scored 0.0. Raise reward.kwargs.timeout if this repeats.")
    return passed


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)
