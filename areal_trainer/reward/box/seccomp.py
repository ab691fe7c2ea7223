"""What locks the box's process in, whatever namespaces it has: resource limits, a seccomp filter and
blocks at the Python level (loaded by path by ``child.py``: standard library only).

* Limits (never above a hard limit the trainer already has): address space ``memory_mb``, CPU seconds,
  no new processes or threads (``RLIMIT_NPROC`` 0), files of at most 16 MiB, 64 open files, no core dumps.
* The seccomp filter (Linux x86-64 and arm64): the kernel refuses this process, whatever its user,
  creating processes or threads, ``exec``, creating sockets and ``io_uring``; signalling, tracing or
  reading the memory of any other process; system administration (mounts, modules, reboot, clocks,
  namespaces, bpf, chroot); and undoing the parent-death signal. ``RLIMIT_NPROC`` alone is not enough:
  the kernel does not apply it to root. In the Landlock box, which shares the trainer's user, IPC and
  PID namespaces, it also refuses what Landlock does not cover: changing modes, owners, times or
  extended attributes of files; System V IPC, POSIX message queues, keyrings; priorities, scheduling
  and resource limits of other processes; fanotify, inotify watches and file handles.
* The Python-level entry points of the same things (``socket``, name lookups, ``os.fork``/``exec*``/
  ``spawn*``/``system``/``popen``/``kill``, ``subprocess``) raise ``PermissionError``: a clear error for
  the code, and a block where seccomp is unavailable.
"""

from __future__ import annotations

import os
import platform
import signal
import sys

FILE_SIZE_LIMIT = 16 << 20
"""Largest file the code may write (RLIMIT_FSIZE), in bytes."""
OPEN_FILES_LIMIT = 64
"""Most file descriptors the code may hold (RLIMIT_NOFILE)."""


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when the process that started it dies (a reward worker
    killed mid-call): being in its own session, it escapes a kill of the worker's process group."""
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)


def set_limits(memory_mb: int, cpu_s: int) -> None:
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
        # execve(at), io_uring, signals, ptrace, vm, pidfd_getfd
        "EPERM": [59, 322, 425, 424, 129, 297, 101, 310, 311, 438,
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
# Refused in the Landlock box only (EPERM), where the code shares the trainer's user, IPC and PID
# namespaces: what Landlock does not cover. Modes, owners, times and extended attributes of files;
# System V IPC and POSIX message queues; keyrings; scheduling and priorities (setpriority reaches every
# process of a user); fanotify, inotify watches, file handles.
_DENY_WITHOUT_NAMESPACES = {
    "x86_64": [90, 91, 268, 452, 92, 93, 94, 260, 188, 189, 190, 197, 198, 199, 463, 466, 132, 235, 261, 280,
               29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, 240, 241, 242, 243, 244, 245, 248, 249, 250,
               141, 142, 144, 203, 251, 314, 300, 301, 254, 303, 304],
    "aarch64": [52, 53, 452, 54, 55, 5, 6, 7, 14, 15, 16, 463, 466, 88,
                186, 187, 188, 189, 190, 191, 192, 193, 194, 195, 196, 197, 180, 181, 182, 183, 184, 185, 217, 218, 219,
                140, 118, 119, 122, 30, 274, 262, 263, 27, 264, 265],
}
_PRLIMIT = {"x86_64": 302, "aarch64": 261}  # in the Landlock box: its own limits only (pid 0 or its own)
_SELF_ONLY = {"x86_64": [62, 200, 234], "aarch64": [129, 130, 131]}  # kill, tkill, tgkill
_PRCTL = {"x86_64": 157, "aarch64": 167}  # refused for PR_SET_PDEATHSIG (1): the code cannot undo it
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _seccomp_program(machine: str, pid: int, shared: bool = False) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter as ``(code, jt, jf, k)`` instructions (see ``_DENY``); ``shared``: the box
    shares the trainer's namespaces (the Landlock box), so ``_DENY_WITHOUT_NAMESPACES`` and ``_PRLIMIT`` too."""
    import errno

    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, kill, err = 0x7FFF0000, 0x80000000, 0x00050000  # SECCOMP_RET_ALLOW / KILL_PROCESS / ERRNO
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH[machine]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":  # x32 syscall numbers (bit 30) would bypass the table
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, err | errno.ENOSYS)]
    for name, numbers in _DENY[machine].items():
        for nr in numbers:
            prog += [(jeq, 0, 1, nr), (ret, 0, 0, err | getattr(errno, name))]
    for nr in _DENY_WITHOUT_NAMESPACES[machine] if shared else []:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, err | errno.EPERM)]
    if shared:  # args[0] must be 0 or our pid
        prog += [(jeq, 0, 5, _PRLIMIT[machine]), (ld, 0, 0, 16), (jeq, 2, 0, 0), (jeq, 1, 0, pid),
                 (ret, 0, 0, err | errno.EPERM), (ld, 0, 0, 0)]
    for nr in _SELF_ONLY[machine]:
        # args[0] (low 32 bits) must be our pid; afterwards reload the syscall number.
        prog += [(jeq, 0, 4, nr), (ld, 0, 0, 16), (jeq, 0, 1, pid), (ret, 0, 0, allow),
                 (ret, 0, 0, err | errno.EPERM), (ld, 0, 0, 0)]
    prog += [(jeq, 0, 3, _PRCTL[machine]), (ld, 0, 0, 16), (jeq, 0, 1, 1), (ret, 0, 0, err | errno.EPERM),
             (ld, 0, 0, 0)]
    return prog + [(ret, 0, 0, allow)]


def install_seccomp(shared: bool = False) -> str:
    """Install the filter (``shared``: see :func:`_seccomp_program`); ``on``, or why not (one word, for the
    report line)."""
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

        prog = _seccomp_program(machine, os.getpid(), shared)
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


def block_python_level() -> None:
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
