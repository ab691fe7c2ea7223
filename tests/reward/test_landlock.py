"""The Landlock box (``reward/box/landlock.py``), the box where the kernel refuses namespaces: what the code
sees and may do, what seccomp adds where Landlock does not reach, the watchdog that bounds its scratch
directory (``reward/keeper.py``), and its end with a worker killed mid-call."""

import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from areal_trainer.reward import code, keeper
from areal_trainer.reward.code import unit_tests

from ..helpers import HANG, alive, wait_dead
from ..isolation import needs_landlock, worker_mid_call

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def scratch_root(tmp_path, monkeypatch):
    """Scratch directories go under ``tmp_path``, which must be empty again after every test."""
    root = tmp_path / "scratch"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert os.listdir(root) == []


def boxed(body: str, tests: list[str], **kwargs) -> float:
    return unit_tests("p", f"```python\n{body}```", "", tests=tests, isolation="landlock", **kwargs)


DENIED = """
import os
def denied(path):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").close()
    except PermissionError:
        return True
    return False
"""


@needs_landlock
def test_the_code_works_in_its_private_scratch_directory_and_reads_nothing_else(scratch_root, tmp_path):
    (tmp_path / "secret").write_text("s")
    body = DENIED + ("import stat, sys, tempfile\nos.makedirs('d/e')\nopen('d/e/x', 'w').write('x')\n"
                     "os.rename('d/e/x', 'd/x')\nhere = os.getcwd()\nmode = stat.S_IMODE(os.stat('.').st_mode)\n"
                     "where = (os.environ['HOME'], os.environ['TMPDIR'], tempfile.gettempdir())\n"
                     "listed = sorted(os.listdir('.'))\nstdlib = open(os.__file__).read(1)\n"
                     "nulled = open('/dev/null', 'w').write('x')\n")
    tests = [f"assert here.startswith({str(scratch_root)!r} + '/areal_code_') and mode == 0o700",
             "assert where == (here, here, here) and listed == ['d']", "assert stdlib and nulled == 1",
             *(f"assert denied({p!r})" for p in [
                 "/etc/passwd", "/etc", "/proc", "/proc/self/status", f"/proc/{os.getpid()}/environ", "/sys", "/dev",
                 "/tmp", str(scratch_root), str(tmp_path / "secret"), str(REPO / "pyproject.toml"),
                 str(Path.home())])]
    assert boxed(body, tests) == 1.0


SHARED = """
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
CALLS = {"chmod": os.chmod, "utime": os.utime, "chown": os.chown, "prlimit": resource.prlimit,
         "setpriority": os.setpriority, "setaffinity": os.sched_setaffinity, "setuid": os.setuid,
         "kill": os.kill, "shmget": libc.shmget, "syscall": libc.syscall, "libc_kill": libc.kill}
def refused(name, *args):
    try:
        result = CALLS[name](*args)
    except PermissionError:
        return True
    return result == -1 and ctypes.get_errno() == 1  # EPERM
"""


@needs_landlock
def test_what_landlock_does_not_cover_is_refused_in_it(tmp_path):
    """Landlock does not cover modes, owners, times, System V IPC, keyrings or other processes' limits
    and priorities; the box shares the trainer's user and namespaces, so seccomp refuses them there."""
    victim = tmp_path / "victim"
    victim.write_text("v")
    victim.chmod(0o600)
    before, limits = victim.stat(), Path(f"/proc/{os.getpid()}/limits").read_text()
    keyctl = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine, 250)
    path, trainer = str(victim), os.getpid()
    # What reaches the trainer sets what it has already: were it not refused, the test would fail, not the trainer.
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    calls = [("chmod", path, 0o666), ("utime", path, (0, 0)), ("chown", path, os.getuid(), os.getgid()),
             ("prlimit", trainer, resource.RLIMIT_NOFILE, nofile),
             ("setpriority", os.PRIO_PROCESS, trainer, os.getpriority(os.PRIO_PROCESS, trainer)),
             ("setaffinity", trainer, os.sched_getaffinity(trainer)),
             ("shmget", 0, 4096, 0o1000 | 0o600),  # IPC_PRIVATE, IPC_CREAT
             ("syscall", keyctl, 0, -4),  # KEYCTL_GET_KEYRING_ID of the user's keyring
             ("setuid", os.getuid() + 1),  # no capability left, also for root
             ("kill", trainer, 0), ("libc_kill", trainer, 0)]
    assert boxed(SHARED, [f"assert refused(*{call!r})" for call in calls]) == 1.0
    after = victim.stat()
    assert (after.st_mode, after.st_mtime_ns, after.st_uid) == (before.st_mode, before.st_mtime_ns, before.st_uid)
    assert Path(f"/proc/{trainer}/limits").read_text() == limits


@needs_landlock
def test_its_own_limits_stay_readable_and_lowerable():
    body = ("import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))\n"
            "limit = resource.getrlimit(resource.RLIMIT_NOFILE)\n")
    assert boxed(body, ["assert limit == (32, 32)"]) == 1.0


@needs_landlock
def test_a_box_that_fills_its_scratch_directory_is_killed_and_named_once(caplog):
    body = "import os\nfor i in range(200):\n    open('f%d' % i, 'wb').write(bytes(1 << 20))\ndef f():\n    return 1\n"
    code._warned.clear()
    with caplog.at_level(logging.WARNING, logger="areal_trainer.reward.code"):
        assert boxed(body, ["assert f() == 1"], timeout=10) == 0.0
        assert boxed(body, ["assert f() == 1"], timeout=10) == 0.0
    killed = [r.getMessage() for r in caplog.records if "a Landlock box was killed" in r.getMessage()]
    assert killed == ["unit_tests: a Landlock box was killed: its scratch directory passed 64 MiB or 4096 entries; "
                      "the tests it had not passed failed."]


WRITER = {
    "bytes": "b = bytes(1 << 20)\nfor i in range(400):\n    open('f%d' % i, 'wb').write(b)",
    "entries": "for i in range(4000):\n    os.mkdir('d%d' % i)",
    "deleted-but-open": "b, kept = bytes(1 << 20), []\nfor i in range(60):\n"
                        "    fd = os.open('f', os.O_CREAT | os.O_RDWR)\n    os.write(fd, b)\n    os.unlink('f')\n"
                        "    kept.append(fd)",
}


@pytest.mark.skipif(sys.platform != "linux", reason="the watchdog reads /proc")
@pytest.mark.parametrize("writes", WRITER.values(), ids=WRITER.keys())
def test_the_watchdog_kills_a_process_group_past_the_bounds(tmp_path, writes):
    watched = tmp_path / "watched"
    watched.mkdir()
    script = f"import os, time\nos.chdir({str(watched)!r})\n{writes}\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    watchdog = keeper.Watchdog(str(watched), proc.pid, max_bytes=16 << 20, max_entries=200)
    try:
        assert proc.wait(timeout=HANG) == -signal.SIGKILL
    finally:
        watchdog.stop()
        proc.kill()
        proc.wait()
    assert watchdog.reason == "its scratch directory passed 16 MiB or 200 entries"
    assert watchdog.peak_bytes > 16 << 20 or watchdog.peak_entries > 200


@pytest.mark.skipif(sys.platform != "linux", reason="the watchdog reads /proc")
def test_the_watchdog_leaves_a_box_within_the_bounds_alone(tmp_path):
    watched = tmp_path / "watched"
    watched.mkdir()
    script = (f"import os, time\nos.chdir({str(watched)!r})\nos.makedirs('a/b')\n"
              "open('a/b/x', 'wb').write(bytes(8 << 20))\ntime.sleep(0.5)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    watchdog = keeper.Watchdog(str(watched), proc.pid, max_bytes=16 << 20, max_entries=200)
    assert proc.wait(timeout=HANG) == 0
    watchdog.stop()
    assert watchdog.reason is None and watchdog.peak_entries == 3 and 8 << 20 <= watchdog.peak_bytes <= 9 << 20




@needs_landlock
def test_the_box_dies_with_a_worker_killed_mid_call(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the killed worker cannot delete its scratch directory
    worker = subprocess.Popen([sys.executable, "-c", worker_mid_call("landlock")], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        box = int(worker.stdout.readline())  # no waiting process around it: the box is the worker's child
        time.sleep(0.5)  # set up in milliseconds: the code sleeps now
        assert alive(box)
    finally:
        worker.kill()
        worker.wait()
    assert wait_dead(box)
