"""The inference servers a run starts itself (``rollout.backend=<engine>:d<N>p1t<T>``): N processes of
``python -m areal_trainer.rollout.servers``, each with ``T`` GPUs (tensor parallelism; on a CPU, ``T`` threads).

They start together, beside the trainer, so they load while it loads; :meth:`ServerFleet.wait_ready` waits until
each listens (``rollout.setup_timeout``) and names the first that exited or hung, with the end of its log. Each
server's output goes to ``<run dir>/servers/server-<i>.log``. They end with the run: :meth:`ServerFleet.stop`
(the run's end, an error, Ctrl-C), and if the trainer itself dies (SIGKILL, a crash) each server notices that its
parent is gone and exits (a parent-death signal on Linux, and a watch on its parent process besides), so no
orphan keeps a port or a GPU.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import UserError

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass
class FleetPlan:
    """What to start: ``count`` servers of ``engine``, each with ``tp`` devices (GPUs, or CPU threads)."""

    engine: str
    count: int
    tp: int
    model_dir: str
    dtype: str
    device: str
    seed: int
    interruptible: bool
    engine_kwargs: dict = field(default_factory=dict)
    first_gpu: int = 0


class ServerFleet:
    """The run's own servers; ``addresses`` once :meth:`wait_ready` returned."""

    def __init__(self, plan: FleetPlan, log_dir: str, host: str = "127.0.0.1"):
        self.plan, self.log_dir, self.host = plan, log_dir, host
        os.makedirs(log_dir, exist_ok=True)
        self.procs: list[subprocess.Popen | None] = [None] * plan.count
        self.addresses: list[str] = [""] * plan.count
        self._lock = threading.Lock()
        atexit.register(self.stop)

    def _port_file(self, i: int) -> str:
        return os.path.join(self.log_dir, f"server-{i}.port")

    def log_path(self, i: int) -> str:
        return os.path.join(self.log_dir, f"server-{i}.log")

    def _spawn(self, i: int) -> subprocess.Popen:
        p = self.plan
        import json

        cmd = [sys.executable, "-m", "areal_trainer.rollout.servers", "--model", p.model_dir, "--engine", p.engine,
               "--host", self.host, "--port", "0", "--port-file", self._port_file(i), "--dtype", p.dtype,
               "--seed", str(p.seed), "--parent-pid", str(os.getpid()), "--engine-kwargs", json.dumps(p.engine_kwargs)]
        env = dict(os.environ)
        if p.device.startswith("cuda"):
            cmd += ["--device", "cuda"]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(p.first_gpu + i * p.tp + k) for k in range(p.tp))
        else:
            cmd += ["--device", "cpu"]
            env["OMP_NUM_THREADS"] = str(p.tp)
        if p.interruptible:
            cmd.append("--interruptible")
        if os.path.exists(self._port_file(i)):
            os.remove(self._port_file(i))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH", "")) if x)
        log = open(self.log_path(i), "ab")
        try:
            main = threading.current_thread() is threading.main_thread()  # the death signal follows the thread
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, preexec_fn=_die_with_parent if main else None)
        finally:
            log.close()

    def start(self) -> None:
        for i in range(self.plan.count):
            self.procs[i] = self._spawn(i)

    def wait_ready(self, timeout: float, which: Sequence[int] | None = None) -> list[str]:
        """Wait until the servers listen; their addresses. Raises naming a server that exited or took too long."""
        end = time.time() + timeout
        pending = set(range(self.plan.count) if which is None else which)
        while pending:
            for i in sorted(pending):
                proc = self.procs[i]
                if os.path.exists(self._port_file(i)):
                    with open(self._port_file(i)) as f:
                        self.addresses[i] = f"{self.host}:{int(f.read().strip())}"
                    pending.discard(i)
                elif proc is None or proc.poll() is not None:
                    code = None if proc is None else proc.returncode
                    raise UserError(f"inference server {i} ({self.plan.engine}) exited with code {code} while "
                                    f"starting; the end of {self.log_path(i)}:\n{self.tail(i)}")
            if pending and time.time() > end:
                i = min(pending)
                raise UserError(f"inference server {i} ({self.plan.engine}) did not listen within "
                                f"rollout.setup_timeout={timeout:g} s; the end of {self.log_path(i)}:\n{self.tail(i)}")
            if pending:
                time.sleep(0.1)
        return list(self.addresses)

    def tail(self, i: int, lines: int = 15) -> str:
        try:
            with open(self.log_path(i), errors="replace") as f:
                return "".join(f.readlines()[-lines:]).rstrip() or "(empty)"
        except OSError:
            return "(no log)"

    def restart(self, i: int, timeout: float = 300.0) -> None:
        """Replace server ``i`` (it died or stopped answering) and wait until the new one listens (same port
        number is not kept: its address is updated in ``addresses``, and the caller's list too)."""
        with self._lock:
            self._kill(i)
            self.procs[i] = self._spawn(i)
        self.wait_ready(timeout, [i])

    def _kill(self, i: int, grace: float = 5.0) -> None:
        proc = self.procs[i]
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(5)

    def stop(self) -> None:
        """End every server and its children (idempotent)."""
        for i in range(len(self.procs)):
            self._kill(i)
        atexit.unregister(self.stop)

    def alive(self) -> list[bool]:
        return [p is not None and p.poll() is None for p in self.procs]
