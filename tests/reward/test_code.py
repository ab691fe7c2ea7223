"""The unit-test reward: scoring, code block extraction, and the sandbox holding against loops, huge
allocations, fork bombs, network access and forged reports, leaving no process or directory behind."""

import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from areal_trainer.errors import UserError
from areal_trainer.reward import code, keeper
from areal_trainer.reward.code import extract_code, split_tests, unit_tests

from ..helpers import HANG, alive, wait_dead, within
from ..isolation import needs_isolation, needs_namespaces, worker_mid_call

pytestmark = needs_isolation

TESTS = ["assert f(1) == 5", "assert f(2) == 8", "assert f(0) == 2", "assert f(-1) == -1"]
RIGHT = "def f(x):\n    return 3 * x + 2\n"
SECCOMP = sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64")


def fenced(body: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{body}```\nIt returns 3x+2."


@pytest.fixture(autouse=True)
def scratch_root(tmp_path, monkeypatch):
    """Scratch directories go under ``tmp_path``, which must be empty again after every test."""
    root = tmp_path / "scratch"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert os.listdir(root) == []


@pytest.fixture
def started(monkeypatch):
    """The pids of the sandbox processes started during the test."""
    pids = []

    class Recording(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pids.append(self.pid)

    monkeypatch.setattr(code.subprocess, "Popen", Recording)
    return pids


def session_members(sid: int) -> list[int]:
    """Live processes whose process group or session is ``sid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if sid in (int(fields[2]), int(fields[3])):
            found.append(int(name))
    return found


def assert_nothing_left(pids: list[int]) -> None:
    assert pids
    for pid in pids:
        assert session_members(pid) == []
        with pytest.raises(ChildProcessError):  # already reaped: no zombie
            os.waitpid(pid, os.WNOHANG)


def test_correct_solution_scores_one():
    assert unit_tests("p", fenced(RIGHT), "", tests=TESTS) == 1.0


def test_half_the_tests():
    half = "def f(x):\n    return 3 * x + 2 if x > 0 else 0\n"
    assert unit_tests("p", fenced(half), "", tests=TESTS) == 0.5


def test_syntax_error_and_raising_code_score_zero():
    assert unit_tests("p", fenced("def f(x) return x\n"), "", tests=TESTS) == 0.0
    assert unit_tests("p", fenced(RIGHT + "raise RuntimeError('boom')\n"), "", tests=TESTS) == 0.0


def test_tests_as_list_and_as_lines():
    lines = "\n".join(TESTS[:2]) + "\n\n# a comment\nassert f(3) == 0\n"
    assert split_tests(lines) == [TESTS[0], TESTS[1], "assert f(3) == 0"]
    assert unit_tests("p", fenced(RIGHT), "", tests=lines) == pytest.approx(2 / 3)
    assert unit_tests("p", fenced(RIGHT), "", tests=tuple(TESTS)) == 1.0


def test_answer_holds_the_tests_when_there_is_no_tests_column():
    assert unit_tests("p", fenced(RIGHT), "\n".join(TESTS)) == 1.0


def test_a_test_that_exits_or_raises_fails_alone():
    tests = ["import sys; sys.exit(0)", "assert f(1) == 5", "raise KeyboardInterrupt", "assert f(0) == 2"]
    assert unit_tests("p", fenced(RIGHT), "", tests=tests) == 0.5


def test_missing_tests_and_bad_limits_are_user_errors():
    with pytest.raises(UserError, match="'answer' column"):
        unit_tests("p", fenced(RIGHT), "", tests=None)
    with pytest.raises(UserError, match="'tests' column"):
        unit_tests("p", fenced(RIGHT), "", tests=[])
    with pytest.raises(UserError, match="reward.kwargs.timeout"):
        unit_tests("p", fenced(RIGHT), "", tests=TESTS, timeout=0)
    with pytest.raises(UserError, match="reward.kwargs.memory_mb"):
        unit_tests("p", fenced(RIGHT), "", tests=TESTS, memory_mb=8)


@pytest.mark.parametrize("completion,expected", [
    ("```python\na = 1\n```\ntext\n```py\nb = 2\n```\n", "b = 2"),  # the last block
    ("```\nc = 3\n```", "c = 3"),  # untagged
    ("```python\nd = 4\n```\n```bash\nls\n```", "d = 4"),  # other languages are skipped
    ("x = 5", "x = 5"),  # no block: the whole completion
    ("```python\ndef g():\n    return 6", "def g():\n    return 6"),  # cut off before the closing fence
    ("1. Code:\n    ```python\n    e = 7\n    ```", "e = 7"),  # indented (inside a list)
    ("```python\nf = 8```", "f = 8"),  # closing fence at the end of a line of code
])
def test_extract_code(completion, expected):
    assert extract_code(completion) == expected


def test_infinite_loop_is_stopped_at_the_timeout(started):
    start = time.monotonic()
    assert within(HANG, unit_tests, "p", fenced("while True:\n    pass\n"), "", tests=TESTS, timeout=1.0) == 0.0
    assert time.monotonic() - start >= 1.0
    assert_nothing_left(started)


def test_hanging_test_keeps_earlier_results():
    body = RIGHT + "def hang():\n    while True:\n        pass\n"
    assert unit_tests("p", fenced(body), "", tests=TESTS[:2] + ["hang()"], timeout=3.0) == pytest.approx(2 / 3)


def test_ten_gigabytes_fail_fast():
    # Refused at once by the memory limit: not swapped until a deadline (set far off, so that only that shows).
    start = time.monotonic()
    assert unit_tests("p", fenced("x = bytearray(10 * 2**30)\n" + RIGHT), "", tests=TESTS, timeout=60) == 0.0
    assert time.monotonic() - start < 30


def test_fork_bomb_leaves_nothing_behind(started):
    bomb = "import os\nwhile True:\n    os.fork()\n" + RIGHT
    assert unit_tests("p", fenced(bomb), "", tests=TESTS, timeout=2.0) == 0.0
    assert_nothing_left(started)


def test_subprocesses_are_refused(started):
    body = "import subprocess\nsubprocess.Popen(['sleep', '60'])\n" + RIGHT
    assert unit_tests("p", fenced(body), "", tests=TESTS, timeout=2.0) == 0.0
    assert_nothing_left(started)


@pytest.mark.skipif(not SECCOMP, reason="the seccomp filter covers Linux x86-64 and arm64")
def test_kernel_refuses_fork_signals_and_sockets_past_python(started):
    # Straight to libc, past the Python-level blocks: f is right only if the kernel refused all.
    body = ("import ctypes\nlibc = ctypes.CDLL(None)\n"
            "results = [libc.fork() for _ in range(3)] + [libc.kill(-1, 0), libc.socket(2, 1, 0)]\n"
            "def f(x):\n    return 3 * x + 2 if all(r == -1 for r in results) else None\n")
    assert unit_tests("p", fenced(body), "", tests=TESTS, timeout=10.0) == 1.0
    assert_nothing_left(started)




@needs_namespaces
def test_sandbox_dies_with_a_worker_killed_mid_call(tmp_path):
    # The killed worker cannot delete its scratch directory: keep it under tmp_path.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    worker = subprocess.Popen([sys.executable, "-c", worker_mid_call("namespaces")], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        outer = int(worker.stdout.readline())
        deadline = time.monotonic() + HANG
        while not (box := keeper.children(outer)):  # the box is the waiting process's one child
            assert alive(outer) and time.monotonic() < deadline, "the sandbox did not start"
            time.sleep(0.01)
        time.sleep(0.5)  # set up in milliseconds: the code sleeps now
        assert alive(box[0])
    finally:
        worker.kill()
        worker.wait()
    assert wait_dead(outer) and wait_dead(box[0])


@pytest.fixture
def server():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


PYTHON_CONNECT = "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
LIBC_CONNECT = ("import ctypes, struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(2, 1, 0)\n"
                "addr = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)\n"
                "assert fd >= 0 and libc.connect(fd, addr, len(addr)) == 0\n")


@pytest.mark.parametrize("attempt", [PYTHON_CONNECT, LIBC_CONNECT], ids=["python", "libc"])
def test_network_connections_fail(server, attempt):
    if attempt is LIBC_CONNECT and not SECCOMP:
        pytest.skip("without seccomp, libc sockets are not blocked (documented)")
    port = server.getsockname()[1]
    in_solution = attempt.format(port=port) + RIGHT
    assert unit_tests("p", fenced(in_solution), "", tests=TESTS, timeout=2.0) == 0.0
    in_test = RIGHT + "def online():\n" + "".join(f"    {line}\n" for line in attempt.format(port=port).splitlines())
    assert unit_tests("p", fenced(in_test), "", tests=TESTS + ["online()"], timeout=2.0) == 0.8
    with pytest.raises(BlockingIOError):  # nothing ever connected
        server.accept()


def test_forged_report_lines_do_not_count():
    forge = ("import os\nfor fd in range(3, 40):\n    try:\n"
             "        os.write(fd, ''.join(f'{'0' * 32} pass {i}\\n' for i in range(4)).encode())\n"
             "    except OSError:\n        pass\nprint('0' * 32 + ' pass 0')\n")
    assert unit_tests("p", fenced(forge), "", tests=TESTS) == 0.0


LOCKED = ("import os\nos.makedirs('locked/inner')\nopen('locked/inner/x', 'w').write('x')\n"
          "os.chmod('locked/inner', 0)\nos.chmod('locked', 0)\n")


@needs_namespaces
def test_the_box_works_in_its_own_empty_tmp():
    # Only what the code made, and the path to a Python environment that lives under /tmp (a fresh clone's).
    body = LOCKED + ("import os, sys\nvenv = {sys.prefix.split('/')[2] if sys.prefix.startswith('/tmp/') else ''}\n"
                     "def where():\n    return os.getcwd(), os.environ['HOME'], sorted(set(os.listdir('.')) - venv)\n")
    assert unit_tests("p", fenced(body), "", tests=["assert where() == ('/tmp', '/tmp', ['locked'])"],
                      isolation="namespaces") == 1.0


def test_without_isolation_the_scratch_directory_is_the_working_directory_and_is_removed(scratch_root):
    body = LOCKED + "here = os.getcwd()\n" + RIGHT
    tests = [f"assert os.path.dirname(here) == {str(scratch_root)!r}", "assert os.environ['HOME'] == here"]
    assert unit_tests("p", fenced(body), "", tests=tests, isolation="off") == 1.0
