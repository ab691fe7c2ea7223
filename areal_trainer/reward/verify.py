"""Symbolic answer checking with the ``math-verify`` library, under a wall-clock deadline.

``math_verify.parse``/``verify`` enforce their own time limits with ``signal.alarm``, which only
works in the main thread. Here both run with those limits switched off, in a long-lived worker
process, and the caller waits at most ``timeout`` seconds for each answer. A check that overruns
scores 0.0 and is counted (see :func:`stats`); the worker is then killed and a fresh one started
for the next check. A warning is logged on the first timeout and then every :data:`WARN_EVERY`.

A process, not a thread, because some answers make sympy run a single C-level operation that never
releases the interpreter lock (``\\boxed{9^{9^{9}}}`` computes a number with 370 million digits):
a thread running it cannot be interrupted, and it would freeze the trainer's own thread as well.
Killing a process always works. The worker is a fresh interpreter running this module (never a
``fork`` of the trainer, which has torch threads running, and never a re-import of the caller's
``__main__`` script as ``multiprocessing``'s ``spawn`` would do). It starts on the first check
that needs it, which takes a second or two.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection, Pipe

logger = logging.getLogger(__name__)

WARN_EVERY = 100
"""Log a warning on the first math-verify timeout and then on every WARN_EVERY-th."""
FLOAT_ROUNDING = 6
"""Decimal places math-verify rounds floats to before comparing them."""
START_TIMEOUT = 120.0
"""Seconds a fresh worker process may take to start (importing sympy and math-verify)."""


class WorkerError(RuntimeError):
    """The function raised inside the worker, or the worker died while running it."""


def serve(fd: int) -> None:
    """Worker process main loop on the connection ``fd``: receive ``(fn, args)``, send back
    ``("ok", result)`` or ``("error", text)``; return when the trainer closes its end."""
    conn = Connection(fd)
    try:
        import math_verify  # noqa: F401 - warm the import before the first deadline starts
    except ImportError:
        pass
    conn.send(("ready", None))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        try:
            reply = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 - reported to the caller as text
            reply = ("error", f"{type(e).__name__}: {str(e)[:500]}")
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send(("error", f"cannot send the result back: {type(e).__name__}: {e}"))


class WorkerProcess:
    """One worker process that runs picklable functions with a per-call deadline.

    Calls are serialised (one at a time). On a timeout the process is killed; the next call starts
    a new one. Functions travel by reference (module and name), so they must be importable. The
    worker exits by itself when this process closes its end of the connection (or dies).
    """

    def __init__(self, start_timeout: float = START_TIMEOUT, name: str = "areal-math-verify"):
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None
        self.start_timeout, self.name = start_timeout, name
        self.restarts = 0
        """How many times a worker was killed or found dead and had to be replaced."""

    @property
    def pid(self) -> int | None:
        """Process id of the running worker, or None when none is running."""
        return self._proc.pid if self._alive() else None

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _start(self) -> None:
        parent, child = Pipe()
        # The child sees the same import path, so functions defined in the caller's modules resolve.
        paths = [p or os.getcwd() for p in sys.path]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        code = "import sys; from areal_trainer.reward.verify import serve; serve(int(sys.argv[1]))"
        proc = subprocess.Popen([sys.executable, "-c", code, str(child.fileno())], pass_fds=[child.fileno()],
                                stdin=subprocess.DEVNULL, env=env)
        child.close()
        self._proc, self._conn = proc, parent
        if not parent.poll(self.start_timeout):
            self.stop()
            raise WorkerError(f"the {self.name} worker did not start within {self.start_timeout} s")
        try:
            parent.recv()
        except EOFError:
            self.stop()
            raise WorkerError(f"the {self.name} worker exited while starting") from None

    def stop(self) -> None:
        """Kill the worker (if any); the next call starts a new one."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a killed process always exits
                logger.warning("math-verify worker %d did not exit after SIGKILL", proc.pid)

    def run(self, fn, *args, timeout: float | None):
        """``fn(*args)`` in the worker. Raises ``TimeoutError`` after ``timeout`` seconds (None: no
        limit) and ``WorkerError`` when ``fn`` raised or the worker died."""
        with self._lock:
            if not self._alive():
                if self._proc is not None:
                    self.restarts += 1
                    self.stop()
                self._start()
            self._conn.send((fn, args))
            if not self._conn.poll(timeout):
                self.restarts += 1
                self.stop()
                raise TimeoutError(f"call did not finish within {timeout} s")
            try:
                status, value = self._conn.recv()
            except (EOFError, OSError):
                self.restarts += 1
                self.stop()
                raise WorkerError("the worker died while running the call") from None
        if status != "ok":
            raise WorkerError(value)
        return value


class _Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls = self.timeouts = self.errors = 0


_STATS = _Stats()
_WORKER = WorkerProcess()
_THREAD = threading.local()


def stats() -> dict[str, int]:
    """Process-wide counts of math-verify checks: ``calls``, ``timeouts`` and ``errors`` (raised)."""
    with _STATS.lock:
        return {"calls": _STATS.calls, "timeouts": _STATS.timeouts, "errors": _STATS.errors}


def timeouts() -> int:
    """How many math-verify checks have timed out in this process (each scored 0.0)."""
    with _STATS.lock:
        return _STATS.timeouts


def thread_timeouts() -> int:
    """How many math-verify checks made by the calling thread have timed out: the reward runner
    reads it around each reward call, so every sample's timeouts are counted where it is scored
    (a rollout thread and the evaluation in the main thread do not mix their counts)."""
    return getattr(_THREAD, "timeouts", 0)


def reset_stats() -> None:
    """Set every counter of :func:`stats` back to zero."""
    with _STATS.lock:
        _STATS.calls = _STATS.timeouts = _STATS.errors = 0


class _DropDisabledTimeoutNotice(logging.Filter):
    """math-verify warns that its own timeout is disabled; here the deadline is enforced outside it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


def _import_math_verify():
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropDisabledTimeoutNotice) for f in lg.filters):
            lg.addFilter(_DropDisabledTimeoutNotice())
    return math_verify


def equivalent(gold: str, prediction: str) -> bool:
    """Whether math-verify finds ``prediction`` (free text or LaTeX) equal to ``gold``. No time limit.

    The gold answer is parsed as an expression, or as inline LaTeX when that finds nothing (bare
    ``\\frac{1}{2}``). The prediction is searched like a model's answer: ``\\boxed{}`` and anchored
    answers ("the final answer is ...") first, then the last expression.
    """
    mv = _import_math_verify()
    gold_parsed = mv.parse(gold, parsing_timeout=None) or mv.parse(f"${gold}$", parsing_timeout=None)
    pred_parsed = mv.parse(prediction, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(mv.verify(gold_parsed, pred_parsed, float_rounding=FLOAT_ROUNDING, timeout_seconds=None))


def verify_answer(gold: str, prediction: str, timeout: float | None = 5.0) -> float:
    """1.0 if math-verify finds ``prediction`` equal to ``gold`` within ``timeout`` seconds, else 0.0.

    Never raises for bad input: a parse failure, an exception or a timeout all give 0.0 (timeouts
    and exceptions are counted in :func:`stats`). ``timeout=None`` waits as long as it takes.
    The check runs :func:`equivalent` (looked up at call time) in the worker process.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
    with _STATS.lock:
        _STATS.calls += 1
    try:
        ok = _WORKER.run(equivalent, gold, prediction, timeout=timeout)
    except TimeoutError:
        _THREAD.timeouts = thread_timeouts() + 1
        with _STATS.lock:
            _STATS.timeouts += 1
            n = _STATS.timeouts
        if n == 1 or n % WARN_EVERY == 0:
            logger.warning("math-verify timed out (%s s) on %d answer(s) so far; each scored 0.0. Latest: %r",
                           timeout, n, prediction[-200:])
        return 0.0
    except Exception as e:  # noqa: BLE001 - a malformed answer must never stop training
        with _STATS.lock:
            _STATS.errors += 1
        logger.debug("math-verify failed on %r: %s", prediction[-200:], e)
        return 0.0
    return 1.0 if ok else 0.0
