"""The run log, ``<run dir>/<job>.log`` (Hydra's job log file), also holds the run's console output.

The job's stdout and stderr are teed: what they show reaches the terminal unchanged, and every
complete line also goes to the file. A line redrawn in place with carriage returns (a progress bar)
is logged once, in its last state, when it ends; the bar's per-step state goes to the file as its own
line (``note``). The progress bar is the only per-step output of the console, so the file keeps
one line per step however often the bar redraws.

Lines are held in memory until the configuration is valid (``RunLog.start``): a run that fails
validation writes nothing, and its run directory can still be removed as unused
(``tracking/rundir.py``). Only one process of a job writes the file: the main rank, and never the
launcher of ``scheduler.type`` (its rank 0 writes the same lines itself).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading

_ACTIVE: RunLog | None = None
"""The job's run log while it runs (``note`` writes to it)."""


QUIET_LIBRARIES = ("httpx", "httpcore", "httpx2", "httpcore2", "openai", "uvicorn", "uvicorn.error",
                   "uvicorn.access")
"""HTTP client and server libraries (``httpx2`` is the ``openai`` package's own copy of httpx): they log every
request at INFO, which an agent run's endpoint turns into thousands of lines."""


def quiet_libraries() -> None:
    """Set the loggers of :data:`QUIET_LIBRARIES` to WARNING, unless the logging configuration gave one a
    level itself (``hydra.verbose=[httpx,httpx2]`` shows their requests again, at DEBUG)."""
    for name in QUIET_LIBRARIES:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def job_log_path() -> str | None:
    """The file Hydra's job logging writes (its root ``FileHandler``); None when job logging is off."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    return None


def _last_state(text: str) -> str:
    """What a terminal shows of ``text`` (no newline in it): the last non-blank part between carriage
    returns, since each one starts a redraw of the line."""
    parts = [p for p in text.split("\r") if p.strip()]
    return parts[-1] if parts else ""


def _shortened(text: str) -> str:
    """``text`` (an unfinished line) with the redraws that nothing can show any more dropped: its last
    part when that is visible, else the last visible one followed by a carriage return (what comes
    next draws over it). A progress bar's line then stays short however long the bar runs."""
    if "\r" not in text:
        return text
    last = text.rsplit("\r", 1)[1]
    return "\r" + last if last.strip() else _last_state(text) + "\r"


class _Tee:
    """A text stream that writes through to ``stream`` and hands complete lines to the run log."""

    def __init__(self, stream, log: RunLog):
        self.stream, self.log, self.pending = stream, log, ""

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        if self.log.capturing:
            with self.log.lock:
                *lines, rest = (self.pending + text).split("\n")
                for line in lines:
                    self.log.add(_last_state(line))
                self.pending = _shortened(rest)
        return n

    def end(self) -> None:
        """Log an unfinished last line (a progress bar that was not closed)."""
        if self.pending.strip():
            self.log.add(_last_state(self.pending))
        self.pending = ""

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):  # isatty, fileno, encoding, ... of the real stream
        return getattr(self.stream, name)


class RunLog:
    """Lines for the run log: held until ``start`` opens the file, then appended as they come."""

    def __init__(self):
        self.lock = threading.RLock()
        self.capturing = True
        self.held: list[str] = []
        self.file = None
        self.path: str | None = None
        self.written = 0
        """Bytes this process appended to the file (its console lines, not Hydra's own records)."""

    def add(self, line: str) -> None:
        with self.lock:
            if self.file is None:
                self.held.append(line)
                return
            data = line.rstrip("\n") + "\n"
            try:
                self.file.write(data)
                self.file.flush()
                self.written += len(data.encode())
            except (OSError, ValueError):  # the run directory's disk is full or gone: the console still has it
                pass

    def start(self, path: str | None) -> None:
        """Write the held lines to ``path`` and every later one (None: stop capturing, drop them)."""
        with self.lock:
            if path is None:
                self.stop()
                return
            self.path = path
            self.file = open(path, "a", encoding="utf-8")
            held, self.held = self.held, []
            for line in held:
                self.add(line)

    def stop(self) -> None:
        with self.lock:
            self.capturing, self.held = False, []

    def close(self) -> None:
        with self.lock:
            self.capturing = False
            if self.file is not None:
                self.file.close()
                self.file = None


def note(line: str) -> None:
    """Write ``line`` to the run log only (not the console), if this process writes one."""
    log = _ACTIVE
    if log is not None and log.capturing:
        log.add(line)


def bytes_written(path: str) -> int:
    """How many bytes of the file at ``path`` are console lines this process wrote."""
    log = _ACTIVE
    if log is None or log.path is None or os.path.abspath(log.path) != os.path.abspath(path):
        return 0
    return log.written


def writes_run_log() -> bool:
    """Whether this process is the one of its job that writes the run log (rank 0 of a launch)."""
    return os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def capture():
    """Tee stdout and stderr into a ``RunLog`` for the duration of one job; call ``start`` on it once
    the configuration is valid."""
    global _ACTIVE
    log = RunLog()
    out, err = sys.stdout, sys.stderr
    tees = [_Tee(out, log), _Tee(err, log)]
    sys.stdout, sys.stderr = tees
    _ACTIVE = log
    try:
        yield log
    finally:
        sys.stdout, sys.stderr = out, err
        with log.lock:
            for tee in tees:
                if log.capturing:
                    tee.end()
        _ACTIVE = None
        log.close()
