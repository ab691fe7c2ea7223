"""The box's own world: new user, mount, PID, IPC, UTS and network namespaces, and a root filesystem
built for it (loaded by path by ``child.py``: standard library only).

:func:`enter` turns the calling process into the first process of a new PID namespace whose view of
the machine is

* ``/usr``, ``/bin``, ``/lib*``, ``/sbin`` and the Python environment (the prefixes and every directory
  on ``sys.path``) read-only, at their usual paths; nothing else of the host's filesystem (no ``/etc``,
  no home directory, no checkout, no checkpoint, no ``/sys``);
* an empty ``/tmp`` (a tmpfs of :data:`SCRATCH_MB` MiB and :data:`SCRATCH_FILES` entries, gone with
  the box) as the only writable place: the working directory, ``HOME`` and ``TMPDIR`` (a Python
  environment that lives under ``/tmp`` is shown read-only inside it, at its path);
* its own ``/proc``, in which it is process 1 and the only process (no ``/proc`` at all where the
  kernel refuses to mount one, e.g. under a container runtime that masks parts of the host's);
* ``/dev`` with ``null``, ``zero``, ``random`` and ``urandom`` only;
* a network namespace with nothing in it (not even a loopback that is up), no System V IPC of the host's.

The user namespace maps the process's own user to root inside, so building all this needs no
privilege; files keep their owners. The steps follow bubblewrap's: make every mount private, put a
tmpfs at ``/tmp`` and pivot into it (the old root stays reachable at ``/oldroot``), bind what is shown
into ``/newroot``, pivot into that, detach the old root, remount the new root read-only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

SCRATCH_MB = 64
"""Size of the box's writable ``/tmp``, in MiB: what generated code can write in all."""
SCRATCH_FILES = 4096
"""Most files and directories in the box's ``/tmp``."""
SHOWN = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin")
"""System paths shown read-only (those that exist; symbolic links are recreated as links)."""
DEVICES = ("null", "zero", "random", "urandom")

_CLONE = {"NEWNS": 0x20000, "NEWUTS": 0x4000000, "NEWIPC": 0x8000000, "NEWUSER": 0x10000000,
          "NEWPID": 0x20000000, "NEWNET": 0x40000000}
_MS = {"RDONLY": 1, "NOSUID": 2, "NODEV": 4, "NOEXEC": 8, "REMOUNT": 32, "NOATIME": 1024, "NODIRATIME": 2048,
       "BIND": 4096, "REC": 16384, "PRIVATE": 1 << 18, "RELATIME": 1 << 21}
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1


class IsolationError(OSError):
    """A step the kernel refused; its text names the step and the reason."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.syscall.restype = ctypes.c_long


def _check(result: int, step: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise IsolationError(errno, f"{step}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
           f"mount {fstype or source} on {target}")


def _pivot_root(new_root: str, put_old: str, machine: str) -> None:
    _check(_libc.syscall(_PIVOT_ROOT[machine], new_root.encode(), put_old.encode()), f"pivot_root {new_root}")


def shown_paths() -> list[str]:
    """What is bound read-only into the box, outermost first: the system paths, the Python prefixes and
    the ``site-packages``/``dist-packages`` directories on ``sys.path`` outside them. Other entries (a
    project on the path, the working directory) are not shown: generated code does not see the trainer's
    own files."""
    prefixes = [os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)]
    sites = [os.path.abspath(p) for p in sys.path
             if p and os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages") and os.path.isdir(p)]
    out: list[str] = []
    for path in [*SHOWN, *sorted({*prefixes, *sites} - {"/"}, key=len)]:
        if not any(path == kept or path.startswith(kept.rstrip("/") + "/") for kept in out):
            out.append(path)
    return out


def enter(machine: str) -> None:
    """Enter the box (see the module docstring). Returns in the box's first process only: the calling
    process waits for it and exits with its status. Raises :class:`IsolationError` before any fork."""
    if machine not in _PIVOT_ROOT:
        raise IsolationError(0, f"namespaces: no pivot_root number for {machine}")
    shown = shown_paths()  # decided before the pivot, with the host's view of the paths
    uid, gid = os.geteuid(), os.getegid()
    flags = 0
    for name in ("NEWUSER", "NEWNS", "NEWPID", "NEWNET", "NEWIPC", "NEWUTS"):
        flags |= _CLONE[name]
    _check(_libc.unshare(flags), "unshare(user, mount, pid, net, ipc, uts namespaces)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    pid = os.fork()  # the child is process 1 of the new PID namespace
    if pid:
        _wait_and_exit(pid)
    # Dies with the waiting process, which dies with the trainer's (seccomp.die_with_parent). Were that
    # process killed before this line, the judge's kill of the process group, or else the CPU limit, ends it.
    _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    _build_root(shown, machine)


def _wait_and_exit(pid: int) -> None:
    """The outer process: nothing to do but wait for the box and exit as it did (it holds no pipe)."""
    for fd in range(3, 256):
        try:
            os.close(fd)
        except OSError:
            pass
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _locked_flags(path: str) -> int:
    """The mount flags of ``path`` that a bind of it must keep (the kernel refuses to clear them)."""
    f, out = os.statvfs(path).f_flag, 0
    for st, ms in ((os.ST_NOSUID, "NOSUID"), (os.ST_NODEV, "NODEV"), (os.ST_NOEXEC, "NOEXEC"),
                   (os.ST_NOATIME, "NOATIME"), (os.ST_NODIRATIME, "NODIRATIME"), (os.ST_RELATIME, "RELATIME")):
        if f & st:
            out |= _MS[ms]
    return out


def _show(path: str, new: str) -> None:
    """Bind ``/oldroot<path>`` read-only at ``<new><path>`` (a system path that is a link, such as ``/lib``
    to ``usr/lib``, is recreated as that link)."""
    source, target = "/oldroot" + path, new + path
    if path in SHOWN and os.path.islink(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(source), target)
    elif os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
        _mount(source, target, None, _MS["BIND"] | _MS["REC"])
        _mount(None, target, None, _MS["BIND"] | _MS["REMOUNT"] | _MS["RDONLY"] | _MS["NOSUID"] | _MS["NODEV"]
               | _locked_flags(target))


def _build_root(shown: list[str], machine: str) -> None:
    nosuid_nodev = _MS["NOSUID"] | _MS["NODEV"]
    _mount(None, "/", None, _MS["REC"] | _MS["PRIVATE"])  # nothing done here reaches the host
    _mount("tmpfs", "/tmp", "tmpfs", nosuid_nodev, "size=1m,nr_inodes=512,mode=755")
    os.mkdir("/tmp/newroot")
    os.mkdir("/tmp/oldroot")
    _pivot_root("/tmp", "/tmp/oldroot", machine)
    os.chdir("/")
    new = "/newroot"
    _mount("tmpfs", new, "tmpfs", nosuid_nodev, "size=1m,nr_inodes=1024,mode=755")
    # The scratch first: a Python environment that lives under /tmp (a fresh clone's .venv) is shown inside it.
    os.mkdir(new + "/tmp")
    _mount("tmpfs", new + "/tmp", "tmpfs", nosuid_nodev,
           f"size={SCRATCH_MB}m,nr_inodes={SCRATCH_FILES},mode=1777")
    for path in shown:
        _show(path, new)
    os.mkdir(new + "/dev", 0o755)
    for name in DEVICES:
        if os.path.exists("/oldroot/dev/" + name):
            open(f"{new}/dev/{name}", "w").close()
            _mount("/oldroot/dev/" + name, f"{new}/dev/{name}", None, _MS["BIND"])
    os.mkdir(new + "/proc", 0o555)
    try:
        _mount("proc", new + "/proc", "proc", nosuid_nodev | _MS["NOEXEC"])
    except IsolationError:
        pass  # a masked host /proc: the box goes without one
    os.chdir(new)
    _pivot_root(".", ".", machine)  # the old root now lies beneath the new one: detach it
    _check(_libc.umount2(b".", _MNT_DETACH), "umount the old root")
    os.chdir("/")
    _mount(None, "/", None, _MS["BIND"] | _MS["REMOUNT"] | _MS["RDONLY"] | nosuid_nodev)
    os.chdir("/tmp")
