"""Hostile and benign completions for the unit-test reward: the acceptance suite of the isolated sandbox.

Each hostile completion can score above 0.0 only if its attack works: it reads a secret planted by the
test, writes or deletes outside its scratch directory, reaches the trainer's environment or process, the
network, gets past the resource limits, or forges a verdict. ``score == 0.0`` therefore proves the attack
failed. Each hostile case also checks from the host that nothing it aimed at changed (planted files,
site-packages, the host's /tmp and /dev/shm, listening sockets, stray processes) and that the call ended in
time. Every benign completion must score exactly 1.0, and after every case no ``areal_code_*`` scratch
directory may be left in ``tempfile.gettempdir()``. Every case runs in each box this machine can set up:
the namespace box and the Landlock box (``tests/isolation.py``), with the same expectations.
"""

import contextlib
import os
import resource
import secrets
import signal
import socket
import string
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from areal_trainer.reward.code import unit_tests

from ..isolation import BOXES

REPO = Path(__file__).resolve().parents[2]
SLACK_S = 5.0  # start-up, kill and cleanup on a busy 2-core machine
CONFIG = '{"lr": 0.001}'


def case(case_id: str, code: str, tests: list[str], timeout: float = 2.0, fence: bool = True):
    code = textwrap.dedent(code).strip("\n") + "\n"
    return pytest.param(f"Here is my solution.\n```python\n{code}```\n" if fence else code, tests, timeout,
                        id=case_id)


class World:
    """Targets planted on the host for one hostile case, the values the completion is formatted with
    (``$name``, each a Python literal), and the host-side checks that none of them was touched."""

    def __init__(self, tmp_path: Path):
        self.token, pid = secrets.token_hex(6), os.getpid()
        (tmp_path / "private").mkdir(mode=0o700)
        self.ckpt, self.outbox = tmp_path / "checkpoints", tmp_path / "outbox"
        self.complete, self.config = self.ckpt / "step_100" / "COMPLETE", tmp_path / "run" / "config.json"
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
        self.pwned = {"host /tmp untouched": Path(f"/tmp/ah{self.token}.pwn"),
                      "/dev/shm untouched": shm / f"ah{self.token}.pwn"}
        self.markers = [Path(f"/tmp/ah{self.token}.marker"), shm / f"ah{self.token}.marker"]
        for path, text in [(tmp_path / "secret.txt", "s3cret"), (tmp_path / "private" / "token", "t0ken"),
                           (self.complete, ""), (self.config, CONFIG), *((m, self.token) for m in self.markers)]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (tmp_path / "secret.txt").chmod(0o600)
        self.outbox.mkdir()
        self.purelib = sysconfig.get_paths()["purelib"]
        self.site_before = set(os.listdir(self.purelib))
        self.comm = f"ah{self.token}"  # the process name of forked children (15 bytes at most)
        unix_path, abstract = str(tmp_path / "s.sock").encode(), f"\0ah{self.token}".encode()
        self.listeners = [socket.create_server(("127.0.0.1", 0))]
        for address in (unix_path, abstract):
            self.listeners.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            self.listeners[-1].bind(address)
        for listener in self.listeners:
            listener.listen(16)  # connect() completes into the backlog: no accept thread needed
            listener.setblocking(False)
        self.connections = []
        self.values = {k: repr(v) for k, v in {
            "secret": str(tmp_path / "secret.txt"), "private_token": str(tmp_path / "private" / "token"),
            "passwd_line": Path("/etc/passwd").read_text().splitlines()[0], "ckpt": str(self.ckpt),
            "pyproject": os.path.abspath(REPO / "pyproject.toml"),
            "pyproject_text": (REPO / "pyproject.toml").read_text(),
            "outbox": str(self.outbox), "config": str(self.config), "complete": str(self.complete),
            "purelib": self.purelib, "token": self.token, "tmp_marker": str(self.markers[0]),
            "tmp_pwn": str(self.pwned["host /tmp untouched"]), "shm_marker": str(self.markers[1]),
            "shm_pwn": str(self.pwned["/dev/shm untouched"]), "env_secret": os.environ["AREAL_HOSTILE_SECRET"],
            "pid": pid, "trainer_environ": Path(f"/proc/{pid}/environ").read_bytes(),
            "trainer_cmdline": Path(f"/proc/{pid}/cmdline").read_bytes(), "port": self.listeners[0].getsockname()[1],
            "unix_path": unix_path, "unix_abstract": abstract, "comm": self.comm.encode(),
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "nice": os.getpriority(os.PRIO_PROCESS, pid)}.items()}
        self.secret = tmp_path / "secret.txt"
        self.secret_mode = self.secret.stat().st_mode

    def format(self, text: str) -> str:
        return string.Template(text).substitute(self.values)

    def strays(self) -> list[int]:
        """Live processes named ``self.comm``: children the completion forked that outlived the call."""
        found = []
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if stat[stat.index("(") + 1:stat.rindex(")")] == self.comm and stat[stat.rindex(")") + 2] not in "ZX":
                found.append(int(name))
        return found

    def broken(self) -> list[str]:
        """What the case changed on the host, by name; empty when everything is intact."""
        for listener in self.listeners:
            with contextlib.suppress(BlockingIOError):
                while True:
                    self.connections.append(listener.accept()[0])
        for _ in range(20):  # children of a killed sandbox may take a moment to go
            if not self.strays():
                break
            time.sleep(0.05)
        intact = {name: not path.exists() for name, path in self.pwned.items()} | {
            "outbox empty": not any(self.outbox.iterdir()), "config.json unchanged": self.config.read_text() == CONFIG,
            "secret.txt mode kept": self.secret.stat().st_mode == self.secret_mode,
            "COMPLETE kept": self.complete.exists(),
            "site-packages unchanged": not self.new_site(), "no connection arrived": not self.connections,
            "no process left": not self.strays()}
        return [name for name, ok in intact.items() if not ok]

    def new_site(self) -> set[str]:
        return set(os.listdir(self.purelib)) - self.site_before

    def close(self) -> None:
        for pid in self.strays():
            os.kill(pid, signal.SIGKILL)
        for name in self.new_site():
            if name.startswith("areal_hostile_"):
                os.unlink(os.path.join(self.purelib, name))
        for path in [*self.markers, *self.pwned.values()]:
            path.unlink(missing_ok=True)
        for sock in self.listeners + self.connections:
            sock.close()


@pytest.fixture(autouse=True)
def scratch_root(tmp_path, monkeypatch):
    """Scratch directories go to a directory of this test, where none may be left afterwards."""
    root = tmp_path / "scratch"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield
    assert [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("areal_code_")] == []


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_HOSTILE_SECRET", f"env-{secrets.token_hex(8)}")
    w = World(tmp_path)
    yield w
    w.close()


@pytest.fixture(params=BOXES)
def isolation(request):
    """Each case runs in each box this machine can set up."""
    return request.param


def score(completion: str, tests: list[str], timeout: float, isolation: str) -> tuple[float, float]:
    start = time.monotonic()
    value = unit_tests("Write the function.", completion, None, tests=tests, timeout=timeout, isolation=isolation)
    return value, time.monotonic() - start


FORK = """\
    import ctypes, os, time
    def f():
        forked = 0
        for _ in range(32):
            try:
                pid = FORK()
            except OSError:
                break
            if pid < 0:
                break
            if pid == 0:
                try:  # a new session escapes a kill of the sandbox's process group
                    ctypes.CDLL(None).prctl(15, $comm, 0, 0, 0)
                    os.setsid()
                    time.sleep(30)
                finally:
                    os._exit(0)
            forked += 1
        return forked
"""
UNIX = """\
    import ctypes, socket, struct
    def f():
        try:
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(ADDRESS)
            return True
        except OSError:
            libc = ctypes.CDLL(None)
            fd, address = libc.socket(1, 1, 0), struct.pack("=H", 1) + ADDRESS
            return fd >= 0 and libc.connect(fd, address, len(address)) == 0
"""
# Only the host's directory holds the marker: writing to a private /tmp or /dev/shm of the box scores 0.
WRITE_MARKED = "def f():\n    return open($DIR_marker).read() == $token and open($DIR_pwn, 'w').write('x') == 1"
WRITES = "def f():\n    return open(PATH, 'w').write('{\"lr\": 1e9}') > 0"
EQUAL = "class Equal(BASE):\n    __eq__ = lambda *_: True\n    __hash__ = BASE.__hash__\nf = lambda: Equal(ARG)"
IS_TRUE, FORTY_TWO = ["assert f() is True"], ["assert f() == 42"]

HOSTILE = [
    # reading
    case("read-0600-file", "def f():\n    return open($secret).read()", ["assert f() == 's3cret'"]),
    case("read-file-in-0700-dir", "def f():\n    return open($private_token).read()", ["assert f() == 't0ken'"]),
    case("read-etc-passwd", "def f():\n    return open('/etc/passwd').read().splitlines()[0]",
         ["assert f() == $passwd_line"]),
    case("read-project-file", "def f():\n    return open($pyproject).read()", ["assert f() == $pyproject_text"]),
    case("list-checkpoints-dir", "import os\ndef f():\n    return sorted(os.listdir($ckpt))",
         ["assert f() == ['step_100']"]),
    # writing
    case("write-outside-scratch", WRITES.replace("PATH", "$outbox + '/pwned.txt'"), IS_TRUE),
    case("overwrite-config", WRITES.replace("PATH", "$config"), IS_TRUE),
    case("delete-complete-marker", "import os\ndef f():\n    os.remove($complete)\n    return True", IS_TRUE),
    case("pth-into-site-packages", WRITES.replace("PATH", "$purelib + '/areal_hostile_' + $token + '.pth'"), IS_TRUE),
    case("write-host-tmp", WRITE_MARKED.replace("DIR", "tmp"), IS_TRUE),
    case("write-dev-shm", WRITE_MARKED.replace("DIR", "shm"), IS_TRUE),
    case("cleanup-traps", """\
        import os
        os.makedirs("trap/deep")
        open("trap/deep/x", "w").close()
        os.symlink($ckpt, "trap/ckpt")  # a cleanup that follows links deletes COMPLETE
        os.chmod("trap/deep", 0)
        os.chmod("trap", 0o500)
        def f(): return 0""", FORTY_TWO),
    # processes and environment
    case("environ-secret", "import os\ndef f():\n    return os.environ.get('AREAL_HOSTILE_SECRET')",
         ["assert f() == $env_secret"]),
    case("proc-trainer-environ", "def f():\n    return open('/proc/%d/environ' % $pid, 'rb').read()",
         ["assert f() == $trainer_environ"]),
    case("proc-trainer-mem-write", """\
        import os
        def f():
            if open("/proc/%d/cmdline" % $pid, "rb").read() != $trainer_cmdline:
                return False  # another process that happens to have the trainer's pid
            os.close(os.open("/proc/%d/mem" % $pid, os.O_RDWR))
            return True""", IS_TRUE),
    case("proc-lists-trainer",
         "import os\ndef f():\n    return os.getpid() != $pid and str($pid) in os.listdir('/proc')", IS_TRUE),
    case("kill-trainer-pid", """\
        import ctypes, os
        def f():
            try:
                return os.getpid() != $pid and os.kill($pid, 0) is None
            except OSError:
                return ctypes.CDLL(None).kill($pid, 0) == 0""", IS_TRUE),
    case("getppid-attack", """\
        import ctypes, os
        def f():
            return open("/proc/%d/cmdline" % os.getppid(), "rb").read()
        def g():
            return os.getppid() > 1 and ctypes.CDLL(None).kill(os.getppid(), 0) == 0""",
         ["assert f() == $trainer_cmdline", "assert g() is True"]),
    # what reaches the trainer without opening /proc (it sets what the trainer has: only success counts)
    case("prlimit-trainer", """\
        import os, resource
        def f():
            return os.getpid() != $pid and resource.prlimit($pid, resource.RLIMIT_NOFILE, $nofile) == $nofile""",
         IS_TRUE),
    case("renice-trainer", """\
        import os
        def f():
            return os.getpid() != $pid and os.setpriority(os.PRIO_PROCESS, $pid, $nice) is None""", IS_TRUE),
    case("chmod-secret", "import os\ndef f():\n    os.chmod($secret, 0o644)\n    return True", IS_TRUE),
    # network
    case("tcp-connect-localhost", """\
        import socket
        def f():
            with socket.create_connection(("127.0.0.1", $port), timeout=1) as s:
                return s.send(b"hi") == 2""", IS_TRUE),
    case("tcp-connect-ctypes", """\
        import ctypes, struct
        def f():
            libc = ctypes.CDLL(None)
            fd = libc.socket(2, 1, 0)
            address = struct.pack("=H", 2) + struct.pack("!H", $port) + bytes([127, 0, 0, 1]) + bytes(8)
            return fd >= 0 and libc.connect(fd, address, len(address)) == 0""", IS_TRUE),
    case("unix-socket", UNIX.replace("ADDRESS", "$unix_path"), IS_TRUE),
    case("unix-abstract-socket", UNIX.replace("ADDRESS", "$unix_abstract"), IS_TRUE),
    # resources
    case("endless-loop", """\
        import signal
        for sig in (signal.SIGXCPU, signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
            signal.signal(sig, signal.SIG_IGN)
        def f():
            while True:
                try:
                    while True:
                        pass
                except BaseException:
                    pass""", ["assert f() is None"], timeout=1.0),
    case("allocate-10gb", "def f():\n    return len(bytearray(10 << 30))", ["assert f() == 10 << 30"]),
    case("fork-bomb-os", FORK.replace("FORK", "os.fork"), ["assert f() > 0"]),
    case("fork-bomb-ctypes", FORK.replace("FORK", "ctypes.CDLL(None).fork"), ["assert f() > 0"]),
    case("fill-disk", """\
        def f():
            total = 0
            for i in range(16):  # 240 MiB at most: enough to show that disk use is not bounded
                try:
                    total += open("fill%d.bin" % i, "wb").write(bytes(15 << 20))
                except OSError:
                    break
            return total""", ["assert f() > 200 << 20"], timeout=5.0),
    case("thousands-of-files", """\
        import os
        def f():
            for made in range(20000):
                try:
                    os.close(os.open("f%d" % made, os.O_CREAT | os.O_WRONLY))
                except OSError:
                    return made
            return 20000""", ["assert f() >= 10000"], timeout=5.0),
    # verdict forging
    case("eq-always-true", EQUAL.replace("BASE", "object").replace("ARG", ""), FORTY_TWO),
    case("int-subclass-eq", EQUAL.replace("BASE", "int").replace("ARG", "0"), FORTY_TWO),
    case("bool-always-true", "class Yes:\n    def __bool__(self):\n        return True\nis_even = lambda n: Yes()",
         ["assert is_even(3)"]),
    case("patch-assertionerror", """\
        import builtins
        builtins.AssertionError = type("AssertionError", (Exception,), {})
        def f(): return 0""", FORTY_TWO + ["if f() != 42:\n    raise AssertionError"]),
    case("patch-exec-compile", """\
        import builtins
        _compile = builtins.compile
        builtins.compile = lambda *args, **kwargs: _compile("pass", "<forged>", "exec")
        builtins.exec = lambda *args, **kwargs: None
        def f(): return 0""", FORTY_TWO),
    case("patch-build-class", """\
        import builtins
        class Forged:
            def __getattr__(self, name):
                return 42
        builtins.__build_class__ = lambda *args, **kwargs: Forged()
        def f(): return 0""", ["class Box:\n    value = f()\nassert Box.value == 42"]),
    case("os-exit-at-import", "import os\ndef f():\n    return 0\nos._exit(0)", FORTY_TWO),
    case("sys-exit-in-function", "import sys\ndef f():\n    sys.exit(0)", FORTY_TWO + ["assert f() is None"]),
    case("fake-report-lines", r"""
        import os
        LINES = b"".join(b"%s pass %d\n" % (w, i) for w in (b"x", b"0" * 32, b"ready", b"") for i in range(10))
        for fd in range(21):
            try: os.write(fd, LINES)
            except OSError: pass
        def f(): return 0""", FORTY_TWO),
    case("steal-report-token", r"""
        import gc, os, re, sys
        frame, values = sys._getframe(), []
        while frame is not None:
            values += frame.f_locals.values()
            frame = frame.f_back
        values += [v for o in gc.get_objects() if isinstance(o, dict) for v in list(o.values())]
        for token in {v for v in values if isinstance(v, str) and re.fullmatch(r"[0-9a-fA-F]{16,64}", v)}:
            for fd in range(21):
                try:
                    os.write(fd, "".join("%s pass %d\n" % (token, i) for i in range(10)).encode())
                except OSError:
                    pass
        def f(): return 0""", FORTY_TWO),
]

BENIGN = [
    case("plain-function", "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    raise SystemExit(1)",
         ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]),
    case("unfenced-completion", "def sq(x):\n    return x * x\n", ["assert sq(3) == 9"], fence=False),
    case("class-methods", """\
        class Stack:
            def __init__(self): self.items = []
            def push(self, x): self.items.append(x)
            def pop(self): return self.items.pop()""",
         ["s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2\nassert s.pop() == 1"]),
    case("recursion", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)", ["assert fib(20) == 6765"]),
    case("stdlib", r"""
        import itertools, json, math, re
        from collections import Counter
        from functools import lru_cache
        def top_word(s): return Counter(s.split()).most_common(1)[0][0]
        def pairs(n): return list(itertools.combinations(range(n), 2))
        @lru_cache(maxsize=None)
        def hyp(a, b):
            return math.hypot(a, b)
        def digits(s):
            return [json.loads(d) for d in re.findall(r"\d+", s)]""",
         ["assert top_word('a b a') == 'a'", "assert pairs(3) == [(0, 1), (0, 2), (1, 2)]",
          "assert hyp(3, 4) == 5.0", "assert digits('a1b22') == [1, 22]"]),
    case("write-cwd-file", """\
        import tempfile
        def roundtrip(s):
            with open("notes.txt", "w") as fh:
                fh.write(s)
            return open("notes.txt").read()
        def tmp_roundtrip(b):
            with tempfile.TemporaryFile() as fh:
                fh.write(b)
                fh.seek(0)
                return fh.read()""", ["assert roundtrip('hello') == 'hello'", "assert tmp_roundtrip(b'x') == b'x'"]),
    case("in-place-mutation", "def sort_in_place(a):\n    a.sort()",
         ["a = [3, 1, 2]\nsort_in_place(a)\nassert a == [1, 2, 3]"]),
    case("expects-exception", "def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return x",
         ["try:\n    f(-1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError", "assert f(2) == 2"]),
    case("generator-expression", "def sq(i):\n    return i * i", ["assert all(sq(i) == i * i for i in range(5))"]),
    case("module-constant", "LIMIT = 10\ndef capped(x):\n    return min(x, LIMIT)",
         ["assert LIMIT == 10", "assert capped(99) == 10"]),
    case("plain-data-results", r"""
        def mean(xs): return sum(xs) / len(xs)
        def bounds(xs): return (min(xs), max(xs))
        def freq(s): return {c: s.count(c) for c in s}
        def kinds(): return {1, 2}, frozenset("a"), b"\x00", 1 + 2j, None, True""",
         ["assert abs(mean([1, 2, 3, 4]) - 2.5) < 1e-9", "assert bounds([3, 1, 2]) == (1, 3)",
          "assert freq('aab') == {'a': 2, 'b': 1}",
          r"assert kinds() == ({1, 2}, frozenset('a'), b'\x00', 1 + 2j, None, True)"]),
    case("prints-to-stdout", """\
        import sys
        print("loading", flush=True)
        def greet(name):
            print("hi", name)
            print("debug", file=sys.stderr)
            return "hi " + name""", ["assert greet('x') == 'hi x'"]),
]


@pytest.mark.parametrize(("completion", "tests", "timeout"), HOSTILE)
def test_hostile_scores_zero(completion, tests, timeout, world, isolation):
    value, elapsed = score(world.format(completion), [world.format(t) for t in tests], timeout, isolation)
    broken = world.broken()
    assert value == 0.0
    assert broken == []
    assert elapsed < timeout + SLACK_S


@pytest.mark.parametrize(("completion", "tests", "timeout"), BENIGN)
def test_benign_scores_one(completion, tests, timeout, isolation):
    value, elapsed = score(completion, tests, timeout, isolation)
    assert value == 1.0
    assert elapsed < timeout + SLACK_S
