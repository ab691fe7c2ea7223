"""Training runs forked from an interpreter that has already imported the trainer.

Importing torch, transformers and the trainer takes about 2.5 s of each ``python -m areal_trainer`` run, on
the order of the whole run for most end-to-end tests. A test process starts one server (a plain interpreter,
not the test process: it has run no torch kernel and holds no thread, so forking it is safe), which imports
those modules once and then forks a child per run. The child becomes what ``python -m areal_trainer`` would
be: the run's working directory, first on ``sys.path``; its environment; standard input from ``/dev/null``
and its output in files the test reads; ``sys.argv``; the module run as ``__main__``; the interpreter's
normal exit (``atexit`` handlers, non-daemon threads, the exit status of ``SystemExit`` or of a traceback).

The server has the environment of the runs without their extra keys; when that changes (libraries used
in the test process add keys to its environment), the server is started again. A run whose extra keys
include one that a library may read when imported (the thread count, the float kernels, ...) is not
forked: :func:`run` (to the run's end) and :func:`start` (left running, as ``subprocess.Popen`` leaves a
process: signals, kills) answer None, and the caller starts a process. One run of a test process is forked at
a time; a run started while another is going is a process. Only ``AREAL_*`` keys, which the
trainer and the tests' plugins read while running, may differ. A forked child has the server's hash seed,
where a fresh process draws one; runs never depend on it (their seeds are set from the config).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import pkgutil
import select
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
import weakref

RUN_TIME_PREFIX = "AREAL_"
"""Environment keys that may differ between the server and a forked run: read only while a run runs."""
_HYDRA = "hydra._internal.core_plugins."
WARM = ("torch", "transformers", "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2",
        "omegaconf", "hydra", *(_HYDRA + name for name in ("basic_launcher", "basic_sweeper", "file_config_source",
                                                           "structured_config_source",
                                                           "importlib_resources_config_source")),
        "tabulate", "matplotlib.pyplot")
"""Imported before the trainer's own modules (matplotlib with the backend that the runs' plots choose)."""


class Unusable(RuntimeError):
    """The server cannot fork runs safely here: the runs start processes of their own."""


class ForkServer:
    """One server process and the environment it was started with."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        requests_r, self._requests = os.pipe()
        self._replies, replies_w = os.pipe()
        code = f"import sys; sys.path.pop(0); from tests.e2e.forkserver import serve; serve({requests_r}, {replies_w})"
        # Its own output goes nowhere (as a run's does not go to a terminal), its errors to this process's.
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=self.env, pass_fds=(requests_r, replies_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        os.close(requests_r)
        os.close(replies_w)
        self._buffer = b""
        self.lock = threading.Lock()
        """Held while a forked run is going: the server serves one at a time."""
        self.running: int | None = None
        """The pid of the forked run going (the run's object is not held here: dropped, it is killed)."""
        self._abandoned = 0
        ready = self._reply(timeout=300)
        if ready != {"ready": True}:
            self.close()
            raise Unusable(f"the fork server cannot fork runs: {ready}")

    def fits(self, env: dict[str, str]) -> bool:
        return not _import_time_differences(env, self.env)

    def _reply(self, timeout: float | None) -> dict | None:
        """The next reply line, or None after ``timeout`` s."""
        while b"\n" not in self._buffer:
            if not select.select([self._replies], [], [], timeout)[0]:
                return None
            chunk = os.read(self._replies, 65536)
            if not chunk:
                raise RuntimeError(f"the fork server ended (exit {self.proc.wait()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def start(self, argv: list[str], cwd: str, env: dict[str, str]) -> ForkedRun:
        """Fork one run (the caller holds :attr:`lock`, which the run releases once it has ended)."""
        while self._abandoned:  # the exit status of a run dropped while running, killed then
            self._reply(timeout=60)
            self._abandoned -= 1
        files = tempfile.TemporaryDirectory(prefix="forked_run_")
        out, err = os.path.join(files.name, "stdout"), os.path.join(files.name, "stderr")
        request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": out, "stderr": err}
        os.write(self._requests, json.dumps(request).encode() + b"\n")
        return ForkedRun(self, ["areal_trainer", *argv], self._reply(timeout=60)["pid"], files)

    def _dropped(self, pid: int) -> None:
        """A run's object was dropped before its end (a failed test): kill the run; its exit status is read
        before the next run starts."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._abandoned += 1
        self.running = None
        self.lock.release()

    def close(self) -> None:
        if self.running is not None:  # left running by a test: it ends with the tests, as a daemon would
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.running, signal.SIGKILL)
        os.close(self._requests)  # the server ends at the end of its requests
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._replies)


class ForkedRun:
    """A forked run as :class:`subprocess.Popen` shows a process started with ``stdout=PIPE, stderr=PIPE,
    text=True``: ``pid``, ``args``, ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``,
    ``terminate``, ``kill``; ``stdout.read()`` and ``stderr.read()`` wait for the end, as on a pipe. Its output
    goes to files, read once it has ended. Not for use from several threads at once."""

    def __init__(self, server: ForkServer, args: list[str], pid: int, files: tempfile.TemporaryDirectory):
        self.args, self.pid, self.returncode = args, pid, None
        self._server, self._files = server, files
        self.stdout, self.stderr = _Output(self), _Output(self)
        server.running = pid
        # Dropped while running (a test that failed before its run ended): killed, and the server freed.
        self._finalizer = weakref.finalize(self, server._dropped, pid)

    def poll(self) -> int | None:
        if self.returncode is None and (status := self._server._reply(timeout=0)) is not None:
            self._ended(status["exit"])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            status = self._server._reply(timeout)
            if status is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended(status["exit"])
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None) -> tuple[str, str]:  # noqa: A002 - Popen's name
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # ended a moment ago, not yet reported
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _ended(self, code: int) -> None:
        self.returncode = code
        self._finalizer.detach()
        for stream, name in ((self.stdout, "stdout"), (self.stderr, "stderr")):
            stream.text = _read(os.path.join(self._files.name, name))
        self._files.cleanup()
        self._server.running = None
        self._server.lock.release()


class _Output:
    """A forked run's ``stdout`` or ``stderr``: read as a pipe is, to the end of the run."""

    def __init__(self, run: ForkedRun):
        self._run, self.text = run, None

    def read(self) -> str:
        self._run.wait()
        text, self.text = self.text, ""
        return text

    def close(self) -> None:
        pass


def _import_time_differences(env: dict[str, str], other: dict[str, str]) -> list[str]:
    """The keys, other than run-time ones, whose values differ between ``env`` and ``other``."""
    return sorted(k for k in set(env) | set(other) if not k.startswith(RUN_TIME_PREFIX) and env.get(k) != other.get(k))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


_server: ForkServer | None = None
_unusable: str | None = None


def start(argv: list[str], cwd, env: dict[str, str], *, base: dict[str, str]) -> ForkedRun | None:
    """``python -m areal_trainer *argv`` with the environment ``env``, forked from this process's server and
    left running, as :class:`subprocess.Popen` starts it. The server has the environment ``base``, the one
    runs get without extra keys; it is started at the first call and again when ``base`` has changed
    (libraries that the tests use in this process add keys to its environment: torch's compiler, wandb,
    pygame, ...). None when ``env`` differs from ``base`` in a key read at import time, when another run of
    this process is forked and going, when the server could not be made safe to fork (a warning says why),
    or when ``AREAL_TEST_FORK=0`` is set: the caller starts a process."""
    global _server, _unusable
    if os.environ.get("AREAL_TEST_FORK", "1") == "0" or not hasattr(os, "fork") or _unusable:
        return None
    if _server is not None and not _server.fits(base):
        if not _server.lock.acquire(blocking=False):
            _note(f"process (a run going, then {_import_time_differences(base, _server.env)})")
            return None
        _note(f"restart {_import_time_differences(base, _server.env)}")
        _server.close()
        _server = None
    if _server is None:
        try:
            _server = ForkServer(base)
        except Unusable as e:
            _unusable = str(e)
            warnings.warn(f"{e}; each run starts a process of its own", stacklevel=3)
            return None
    if not _server.fits(env) or not _server.lock.acquire(blocking=False):  # one run at a time: others start
        _note(f"process {_import_time_differences(env, _server.env)}")
        return None
    _note("forked")
    try:
        return _server.start(argv, cwd, env)
    except BaseException:
        _server.lock.release()
        raise


def run(argv: list[str], cwd, env: dict[str, str], timeout: float, *,
        base: dict[str, str]) -> subprocess.CompletedProcess | None:
    """As :func:`start`, run to its end: its exit status and output as :func:`subprocess.run` with
    ``capture_output`` gives them. After ``timeout`` s, or when the test is interrupted, the run is killed."""
    proc = start(argv, cwd, env, base=base)
    if proc is None:
        return None
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as e:  # a timeout, or an interrupted test (Ctrl-C): the run ends, as subprocess.run's does
        proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=60)  # its exit status, so that the next run reads its own
        if isinstance(e, subprocess.TimeoutExpired) and proc.returncode is not None:
            raise subprocess.TimeoutExpired(proc.args, timeout, proc.stdout.read(), proc.stderr.read()) from None
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _note(what: str) -> None:
    """``AREAL_TEST_FORK_LOG=<file>``: a line per run (forked, or a process and the keys that made it one) and
    per restart of the server, to see where the runs go."""
    if path := os.environ.get("AREAL_TEST_FORK_LOG"):
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {what}\n")


@atexit.register
def _close() -> None:
    if _server is not None:
        _server.close()


# -- the server ---------------------------------------------------------------------------------------------
def _warm() -> None:
    """Import what every run imports: the libraries and each module of the trainer (those missing here, or
    whose optional dependencies are, are left to the runs, which report them)."""
    import matplotlib

    matplotlib.use("Agg")
    import areal_trainer

    trainer = (info.name for info in pkgutil.walk_packages(areal_trainer.__path__, "areal_trainer.")
               if not info.name.endswith("__main__"))
    for name in (*WARM, *trainer):
        try:
            importlib.import_module(name)
        except ImportError:  # not installed in this environment (tabulate in .venv-vllm, ...)
            pass
    _fill_caches()


def _fill_caches() -> None:
    """Fill the per-process caches that every run fills the same way, whatever its config and environment:
    each forked run inherits them instead of filling them again (about a second of a seconds-long run)."""
    from areal_trainer.config import keys, store

    store.register_configs()  # the schema in Hydra's ConfigStore, the resolvers
    keys.index()  # every config key with its docs (parsed from the schema's source)
    try:  # transformers' table of checkpoint conversions, which saving and loading a model build first
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # another transformers: the runs build what it has
        return
    get_checkpoint_conversion_mapping("llama")


def serve(requests_fd: int, replies_fd: int) -> None:
    """Answer each request line with ``{"pid": ...}`` once forked and ``{"exit": ...}`` once ended."""
    try:
        _warm()
    except Exception as e:  # noqa: BLE001 - reported to the test process, whose runs then start processes
        os.write(replies_fd, json.dumps({"ready": False, "import": repr(e)}).encode() + b"\n")
        return
    threads = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [None]
    if len(threads) != 1:  # a thread would not exist in the child, holding whatever lock it held
        names = sorted(_thread_name(t) for t in threads)
        os.write(replies_fd, json.dumps({"ready": False, "threads": names}).encode() + b"\n")
        return
    os.write(replies_fd, b'{"ready": true}\n')
    requests = os.fdopen(requests_fd, "rb")
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            os.close(replies_fd)
            _become_the_run(request)
        os.write(replies_fd, json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        os.write(replies_fd, json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _thread_name(tid) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return str(tid)


def _become_the_run(request: dict) -> None:
    """In the child: set up what ``python -m areal_trainer`` would have, then run it. Its ``SystemExit``
    (or exception) leaves through :func:`serve` and ends the interpreter as it would end the command."""
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.path[0:0] = [os.getcwd()]  # as ``-m`` puts it
    importlib.invalidate_caches()
    sys.argv = ["areal_trainer", *request["argv"]]
    runpy.run_module("areal_trainer", run_name="__main__", alter_sys=True)
    sys.exit(0)
