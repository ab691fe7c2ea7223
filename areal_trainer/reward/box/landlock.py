"""The box where the kernel refuses namespaces: a Landlock domain (Linux >= 5.13) around the process
(loaded by path by ``child.py``: standard library only).

:func:`enter` confines the calling process, for good, to

* read and execute on the system paths and the Python environment (the same list as the namespace box
  shows: ``namespaces.shown_paths``); nothing else of the filesystem: no ``/etc``, no home directory,
  checkout or checkpoint, no ``/proc`` (not even its own: the interpreter has started and needs none),
  no ``/sys``;
* read and write on ``/dev/null``, ``zero``, ``random``, ``urandom``;
* everything but device nodes in its scratch directory (made per call by the judge, mode 0700, removed
  after it), which becomes its working directory, ``HOME`` and ``TMPDIR``;
* with ABI >= 4, no TCP bind or connect; with ABI >= 6, no signal to and no abstract UNIX socket of any
  process outside its domain (the trainer, other boxes).

It also drops every capability (a trainer running as root gives the code none) and sets
``no_new_privs``. Landlock has no private filesystem: the judge bounds the scratch directory's size and
entries from outside (``reward/keeper.py``), and ``seccomp.py`` adds what Landlock does not cover
(changes of modes, owners, times and extended attributes; System V IPC, message queues, keyrings;
scheduling and limits of other processes).
"""

from __future__ import annotations

import ctypes
import os
import stat

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on x86-64 and arm64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS = {name: 1 << bit for bit, name in enumerate(
    ("EXECUTE", "WRITE_FILE", "READ_FILE", "READ_DIR", "REMOVE_DIR", "REMOVE_FILE", "MAKE_CHAR", "MAKE_DIR",
     "MAKE_REG", "MAKE_SOCK", "MAKE_FIFO", "MAKE_BLOCK", "MAKE_SYM", "REFER", "TRUNCATE", "IOCTL_DEV"))}
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
"""The filesystem rights each ABI knows: all of them are handled (denied unless a rule grants them)."""
_NET_TCP = 1 | 2  # LANDLOCK_ACCESS_NET_BIND_TCP | CONNECT_TCP (ABI 4)
_SCOPE = 1 | 2  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6)
_READ = _FS["EXECUTE"] | _FS["READ_FILE"] | _FS["READ_DIR"]
_FILE_ONLY = _FS["EXECUTE"] | _FS["WRITE_FILE"] | _FS["READ_FILE"] | _FS["TRUNCATE"] | _FS["IOCTL_DEV"]
_NO_DEVICES = ~(_FS["MAKE_CHAR"] | _FS["MAKE_BLOCK"] | _FS["IOCTL_DEV"])
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
_CAPSET = {"x86_64": 126, "aarch64": 91}
_CAP_VERSION_3 = 0x20080522
DEVICES = ("null", "zero", "random", "urandom")


class LandlockError(OSError):
    """A step the kernel refused; its text names the step and the reason."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _fail(step: str):
    errno = ctypes.get_errno()
    raise LandlockError(errno, f"{step}: {os.strerror(errno)}")


def abi() -> int:
    """The kernel's Landlock ABI version; :class:`LandlockError` where it has none or it is disabled."""
    version = _libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if version < 0:
        errno = ctypes.get_errno()
        why = {38: "the kernel has no Landlock (Linux >= 5.13 built with it)",
               95: "Landlock is disabled (add landlock to the kernel's lsm= boot parameter)"}.get(errno)
        why = why or os.strerror(errno)
        raise LandlockError(errno, f"landlock_create_ruleset: {why}")
    return int(version)


def enter(readable: list[str], scratch: str, machine: str) -> int:
    """Confine this process (see the module docstring); its ABI version. Raises :class:`LandlockError`
    before confining anything when a step is refused."""
    if machine not in _CAPSET:
        raise LandlockError(0, f"landlock: no capset number for {machine}")
    version = abi()
    handled = _FS_BY_ABI[min(version, 5)]
    attr = _RulesetAttr(handled, _NET_TCP if version >= 4 else 0, _SCOPE if version >= 6 else 0)
    size = 24 if version >= 6 else 16 if version >= 4 else 8  # older kernels take the shorter struct only
    ruleset = _libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        _fail("landlock_create_ruleset")
    try:
        for path in readable:
            _allow(ruleset, path, _READ & handled, optional=True)
        for name in DEVICES:
            _allow(ruleset, "/dev/" + name, (_FS["READ_FILE"] | _FS["WRITE_FILE"]) & handled, optional=True)
        _allow(ruleset, scratch, handled & _NO_DEVICES, optional=False)
        _drop_capabilities(machine)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            _fail("prctl(PR_SET_NO_NEW_PRIVS)")
        if _libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)
    os.chdir(scratch)
    os.environ.update(HOME=scratch, TMPDIR=scratch)
    return version


def _allow(ruleset: int, path: str, access: int, *, optional: bool) -> None:
    """Grant ``access`` beneath ``path`` (a file gets the rights that apply to files only)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        if optional and isinstance(e, FileNotFoundError):
            return
        raise LandlockError(e.errno, f"landlock: open {path}: {e.strerror}") from None
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_ONLY
        rule = _PathBeneath(access, fd)
        if _libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                         ctypes.c_uint32(0)) != 0:
            _fail(f"landlock_add_rule {path}")
    finally:
        os.close(fd)


def _drop_capabilities(machine: str) -> None:
    """No capability left in any set (root's included): the code cannot override file modes, change its
    user, or use what root may beyond them. A no-op for an ordinary user."""
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability (EINVAL), or none to drop without CAP_SETPCAP (EPERM)
    _libc.prctl(_PR_CAP_AMBIENT, _CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (capabilities 0-31, 32-63)
    if _libc.syscall(_CAPSET[machine], header, data) != 0:
        _fail("capset (dropping capabilities)")
