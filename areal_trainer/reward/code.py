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
A fresh interpreter, ``sys.executable -I -B`` running this file as a script (never a ``fork`` of the
trainer, which has torch threads; ``-I``: no ``PYTHON*`` variables, no user site directory, neither
the script's nor the working directory on ``sys.path``; the environment's installed packages stay
importable). It runs in a new session and process group, in a new temporary directory (deleted
afterwards) as its working directory, with stdin/stdout/stderr on ``/dev/null``, no inherited file
descriptors but the pipe it reports on, and a minimal environment (``PATH``, a UTF-8 locale, ``HOME``
and ``TMPDIR`` set to the scratch directory, one BLAS/OpenMP thread). Before the code runs, it:

1. asks the kernel to SIGKILL it when the process that started it dies (``PR_SET_PDEATHSIG``), so a
   reward worker killed mid-call takes its sandbox along, though the sandbox has its own session;
2. sets resource limits (never above a hard limit the trainer already has): address space
   ``memory_mb``, CPU seconds ``ceil(timeout) + 1``, no new processes or threads (``RLIMIT_NPROC``
   0), files of at most 16 MiB, 64 open files, no core dumps;
3. installs a seccomp filter (Linux x86-64 and arm64) with which the kernel refuses this process,
   whatever its user: creating processes or threads, ``exec``, creating sockets (no network, no
   Unix-socket services either) and ``io_uring``; signalling, tracing or reading the memory of any
   other process through system calls; system administration (mounts, modules, reboot, clocks,
   namespaces, bpf); and undoing step 1. ``RLIMIT_NPROC`` alone is not enough: the kernel does not
   apply it to root, and trainers often run as root in containers;
4. replaces the Python-level entry points of the same things (``socket.socket`` and its helpers, name
   lookups, ``os.fork``/``exec*``/``spawn*``/``system``/``popen``/``kill``, ``subprocess``), which
   gives the code a clear ``PermissionError`` and still blocks them where seccomp is unavailable.

The parent waits at most ``timeout`` seconds (wall clock, including the ~0.05 s interpreter start-up),
then SIGKILLs the whole process group, always, and reaps the child: no zombie, no leftover process
(the child cannot create any), no leftover scratch directory. Results come back over a pipe as lines
tagged with a random per-run token, read up to 1 MiB, so printed or written fake results do not
count and the code cannot flood the trainer's memory. Only a caller killed mid-call (its sandbox
dies with it, step 1) leaves its scratch directory behind.

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
import platform
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

logger = logging.getLogger(__name__)

MAX_REPORT_BYTES = 1 << 20
"""Most bytes of the child's report that the parent reads (a test adds about 40)."""
FILE_SIZE_LIMIT = 16 << 20
"""Largest file the code may write (RLIMIT_FSIZE), in bytes."""
OPEN_FILES_LIMIT = 64
"""Most file descriptors the code may hold (RLIMIT_NOFILE)."""
MIN_MEMORY_MB = 64
"""The smallest ``memory_mb`` accepted: below it the interpreter itself cannot run."""
_PYTHON_TAGS = {"", "python", "py", "python3"}
_PAYLOAD = "payload.json"
_POLL_S = 0.005
_warned: set[str] = set()


# --------------------------------------------------------------------------------------------
# The reward (parent side)
# --------------------------------------------------------------------------------------------

def unit_tests(prompt, completion, answer, *, tests=None, timeout: float = 5.0, memory_mb: int = 512,
               **fields) -> float:
    """Fraction of ``tests`` (the row's column; ``answer`` when it has none) that pass after the
    completion's code; see the module docstring. ``prompt`` and other row fields are ignored."""
    test_list = split_tests(answer if tests is None else tests, "tests" if tests is not None else "answer")
    _check_limits(timeout, memory_mb)
    passed = run_tests(extract_code(completion or ""), test_list, timeout=float(timeout),
                       memory_mb=int(memory_mb))
    return sum(passed) / len(test_list)


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
        raise _user_error(
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
        with open(os.path.join(scratch, _PAYLOAD), "w", encoding="utf-8") as f:
            json.dump({"code": code, "tests": tests, "nonce": nonce, "memory_mb": memory_mb,
                       "cpu_s": math.ceil(timeout) + 1}, f)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", os.path.abspath(__file__), str(write_fd), str(os.getpid())],
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
        raise _user_error(f"reward.kwargs.timeout: got {timeout!r}; give the seconds each program may run, "
                          "a number > 0 (default 5).")
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < MIN_MEMORY_MB:
        raise _user_error(f"reward.kwargs.memory_mb: got {memory_mb!r}; give the address-space limit in MiB, "
                          f"an integer >= {MIN_MEMORY_MB} (default 512).")


def _user_error(message: str) -> Exception:
    # Imported here, not at the top: this file also runs as the child's script, outside the package.
    from ..errors import UserError

    return UserError(message)


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


# --------------------------------------------------------------------------------------------
# The child (this file run as a script)
# --------------------------------------------------------------------------------------------

def _child_main(report_fd: int, parent_pid: int) -> None:
    """Run the payload's code then each test, reporting ``<nonce> pass <i>`` per passing test."""
    with open(_PAYLOAD, encoding="utf-8") as f:
        payload = json.load(f)
    os.unlink(_PAYLOAD)
    nonce = payload["nonce"]

    def report(kind: str, value) -> None:
        os.write(report_fd, f"{nonce} {kind} {value}\n".encode())

    try:
        _die_with_parent(parent_pid)
        _set_limits(payload["memory_mb"], payload["cpu_s"])
        seccomp = _install_seccomp()
        _block_python_level()
    except Exception as e:  # noqa: BLE001 - reported: the parent raises instead of scoring 0.0
        report("setup-error", f"{type(e).__name__}: {e}".replace("\n", " "))
        os._exit(1)
    report("ready", seccomp)
    namespace = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(payload["code"], "<solution>", "exec"), namespace)
    except BaseException:  # noqa: BLE001 - code that does not run passes no test
        os._exit(0)
    for i, test in enumerate(payload["tests"]):
        try:
            exec(compile(test, f"<test {i}>", "exec"), namespace)
        except BaseException:  # noqa: BLE001 - a failing, raising or exiting test counts as failed
            continue
        report("pass", i)
    os._exit(0)  # skip interpreter shutdown: atexit handlers and finalizers of the code do not run


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when the process that started it dies (a reward worker
    killed mid-call): being in its own session, it escapes a kill of the worker's process group."""
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)


def _set_limits(memory_mb: int, cpu_s: int) -> None:
    import resource

    def limit(which: int, soft: int, hard: int) -> None:
        # Never above a hard limit the trainer already runs under: raising one is not allowed.
        ceiling = resource.getrlimit(which)[1]
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(which, (soft, hard))

    for which, value in [(resource.RLIMIT_AS, memory_mb << 20), (resource.RLIMIT_NPROC, 0),
                         (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT), (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT),
                         (resource.RLIMIT_CORE, 0)]:
        limit(which, value, value)
    limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)  # SIGXCPU at the soft limit, SIGKILL a second later


# Syscalls the seccomp filter refuses, by architecture, with the errno returned. kill, tkill and
# tgkill are allowed when their first argument is the process's own pid (the interpreter signals
# itself, e.g. abort()), refused otherwise.
_DENY = {
    "x86_64": {
        "EAGAIN": [56, 57, 58],  # clone, fork, vfork
        "ENOSYS": [435],  # clone3: libc then falls back to clone
        "EACCES": [41, 53],  # socket, socketpair
        "EPERM": [59, 322, 425, 424, 129, 297, 101, 310, 311, 438,  # execve(at), io_uring, signals, ptrace, vm, pidfd_getfd
                  169, 246, 320, 175, 313, 176, 165, 166, 155, 161, 167, 168, 308, 272, 321, 298,
                  164, 227, 305, 159, 170, 171, 163, 172, 173, 428, 429, 430, 431, 432, 433, 442],
    },
    "aarch64": {
        "EAGAIN": [220],
        "ENOSYS": [435],
        "EACCES": [198, 199],
        "EPERM": [221, 281, 425, 424, 138, 240, 117, 270, 271, 438,
                  142, 104, 294, 105, 273, 106, 40, 39, 41, 51, 224, 225, 268, 97, 280, 241,
                  170, 112, 266, 171, 161, 162, 89, 428, 429, 430, 431, 432, 433, 442],
    },
}
_SELF_ONLY = {"x86_64": [62, 200, 234], "aarch64": [129, 130, 131]}  # kill, tkill, tgkill
_PRCTL = {"x86_64": 157, "aarch64": 167}  # refused for PR_SET_PDEATHSIG (1): the code cannot undo it
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _seccomp_program(machine: str, pid: int) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter as ``(code, jt, jf, k)`` instructions (see ``_DENY``)."""
    import errno

    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, kill, err = 0x7FFF0000, 0x80000000, 0x00050000  # SECCOMP_RET_ALLOW / KILL_PROCESS / ERRNO
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH[machine]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":  # x32 syscall numbers (bit 30) would bypass the table
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, err | errno.ENOSYS)]
    for name, numbers in _DENY[machine].items():
        for nr in numbers:
            prog += [(jeq, 0, 1, nr), (ret, 0, 0, err | getattr(errno, name))]
    for nr in _SELF_ONLY[machine]:
        # args[0] (low 32 bits) must be our pid; afterwards reload the syscall number.
        prog += [(jeq, 0, 4, nr), (ld, 0, 0, 16), (jeq, 0, 1, pid), (ret, 0, 0, allow),
                 (ret, 0, 0, err | errno.EPERM), (ld, 0, 0, 0)]
    prog += [(jeq, 0, 3, _PRCTL[machine]), (ld, 0, 0, 16), (jeq, 0, 1, 1), (ret, 0, 0, err | errno.EPERM),
             (ld, 0, 0, 0)]
    return prog + [(ret, 0, 0, allow)]


def _install_seccomp() -> str:
    """Install the filter; ``on``, or why not (one word, for the report line)."""
    machine = platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")
    if sys.platform != "linux" or machine not in _DENY:
        return f"unsupported-platform-{sys.platform}-{machine}"
    try:
        import ctypes

        class SockFilter(ctypes.Structure):
            _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                        ("k", ctypes.c_uint32)]

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

        prog = _seccomp_program(machine, os.getpid())
        filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
        fprog = SockFprog(len(prog), filters)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
        if libc.prctl(pr_set_no_new_privs, 1, None, 0, 0) != 0:
            return f"no_new_privs-errno-{ctypes.get_errno()}"
        if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.addressof(fprog), 0, 0) != 0:
            return f"prctl-errno-{ctypes.get_errno()}"
    except (OSError, AttributeError, ImportError) as e:
        return type(e).__name__
    return "on"


_SOCKET_FUNCTIONS = ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo", "gethostbyname",
                     "gethostbyname_ex", "gethostbyaddr", "getnameinfo")
_PROCESS_FUNCTIONS = ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "kill", "killpg",
                      "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                      "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe")


def _block_python_level() -> None:
    """Make the usual Python ways to reach the network, other processes and programs raise."""
    import _posixsubprocess
    import _socket
    import posix
    import socket

    def denied(*_args, **_kwargs):
        raise PermissionError("unit_tests sandbox: networking, processes and signals to others are disabled")

    class NoSocket(socket.socket):
        def __init__(self, *_args, **_kwargs):
            denied()

    def replace(module, names, value) -> None:
        for name in names:
            if hasattr(module, name):
                setattr(module, name, value)

    for module in (socket, _socket):
        replace(module, ("socket", "SocketType"), NoSocket)
        replace(module, _SOCKET_FUNCTIONS, denied)
    for module in (os, posix):
        replace(module, _PROCESS_FUNCTIONS, denied)
    _posixsubprocess.fork_exec = denied  # what subprocess.Popen uses


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
