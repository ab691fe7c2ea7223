"""The box: the process that runs generated code, locked in before the code runs, then answering the
judge's calls into it.

:func:`areal_trainer.reward.code.run_tests` runs this file as ``sys.executable -I -B child.py <requests fd>
<answers fd> <parent pid>`` in a fresh interpreter. It is a script of its own: it and the files it loads
by path (``wire.py``, ``seccomp.py``, ``namespaces.py``, ``landlock.py``) import only the standard
library, so the box starts fast and holds nothing of the trainer (no torch, no package state). It reads
the payload (the code, the limits, the isolation asked for) as the first request, then:

1. asks the kernel to SIGKILL it when the process that started it dies;
2. enters its box unless ``isolation`` is ``off``: its namespaces (``namespaces.py``), or where the
   kernel refuses them (``auto``) or where asked (``landlock``), a Landlock domain (``landlock.py``);
3. sets its limits, installs the seccomp filter and the Python-level blocks (``seccomp.py``);
4. answers ``ready`` with what is in force, runs the code as module ``__solution__`` and answers ``loaded``
   with the names it defined (plain values as they are, other objects as handles), or ``raised``;
5. then serves requests (``call``, ``getattr``, ``getitem``, ...) on those handles until the judge closes
   the pipe. The tests themselves never enter the box: the judge runs them and only calls in.

Everything the box sends is untrusted: the judge decodes it as plain data only (``wire.py``).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str):
    """A sibling file as a private module (``_box_<name>``): never importable by the code under a common name."""
    spec = importlib.util.spec_from_file_location(f"_box_{name}", os.path.join(_HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(request_fd: int, answer_fd: int, parent_pid: int) -> None:
    wire, seccomp = _load("wire"), _load("seccomp")
    lines = wire.Lines(request_fd)

    def send(message: dict) -> None:
        data = wire.dumps(message)
        while data:
            data = data[os.write(answer_fd, data):]

    def receive() -> dict | None:
        while (line := lines.pending()) is None:
            chunk = os.read(request_fd, 65536)
            if not chunk:
                return None
            lines.feed(chunk)
        return wire.loads(line)

    payload = receive()
    if payload is None:
        os._exit(1)
    machine = platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")
    try:
        seccomp.die_with_parent(parent_pid)
        isolation, details = _isolate(payload["isolation"], machine)
        seccomp.set_limits(payload["memory_mb"], payload["cpu_s"])
        filter_state = seccomp.install_seccomp(shared=isolation == "landlock")
        if isolation == "landlock" and filter_state != "on":
            raise OSError(f"the Landlock box needs its seccomp filter, which could not be installed ({filter_state})")
        seccomp.block_python_level()
    except Exception as e:  # noqa: BLE001 - reported: the judge raises instead of scoring 0.0
        send({"setup-error": _describe(e, 2000).replace("\n", " ")})
        os._exit(1)
    send({"ready": isolation, "seccomp": filter_state, **details})
    namespace = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(payload["code"], "<solution>", "exec"), namespace)
    except BaseException as e:  # noqa: BLE001 - code that does not run passes no test
        send({"raised": _describe(e)})
        os._exit(0)
    _serve(namespace, send, receive, wire)


class Refused(OSError):
    """Neither box could be entered: its text names both refusals."""


def _isolate(asked: str, machine: str) -> tuple[str, dict]:
    """Enter the box asked for (``namespaces``, ``landlock``; ``auto``: namespaces where the kernel allows
    them, else Landlock); what is in force and what the ``ready`` message adds (the Landlock ABI, why the
    namespaces were refused). Raises the refusal, or :class:`Refused` naming both, before the code runs."""
    if asked == "off":
        return "off", {}
    namespaces, refused = _load("namespaces"), None
    if asked in ("auto", "namespaces"):
        try:
            namespaces.enter(machine)
            return "namespaces", {}
        except OSError as e:  # the kernel's refusal (IsolationError), or a refused write of the id maps
            if asked == "namespaces":
                raise
            refused = _describe(e, 1000)
    try:
        # The judge started the box in its scratch directory: private to this call, mode 0700.
        abi = _load("landlock").enter(namespaces.shown_paths(), os.getcwd(), machine)
    except OSError as e:
        if refused is None:
            raise
        raise Refused(f"namespaces: {refused}; Landlock: {_describe(e, 1000)}") from None
    return "landlock", {"landlock": abi, **({"namespaces": refused} if refused else {})}


def _describe(e: BaseException, limit: int = 500) -> str:
    """``Type: message``, at most ``limit`` characters; an exception whose ``str`` raises too gets its type only."""
    try:
        return f"{type(e).__name__}: {e}"[:limit]
    except BaseException:  # noqa: BLE001 - the code's own exception class may misbehave
        return type(e).__name__


_OPS = {
    "call": lambda obj, r: obj(*r["args"], **r["kwargs"]),
    "getattr": lambda obj, r: getattr(obj, r["name"]),
    "setattr": lambda obj, r: setattr(obj, r["name"], r["value"]),
    "getitem": lambda obj, r: obj[r["key"]],
    "setitem": lambda obj, r: obj.__setitem__(r["key"], r["value"]),
    "list": lambda obj, r: list(obj),
    "next": lambda obj, r: next(obj),
    "len": lambda obj, r: len(obj),
    "contains": lambda obj, r: r["key"] in obj,
    "str": lambda obj, r: str(obj),
    "repr": lambda obj, r: repr(obj),
    "int": lambda obj, r: int(obj),
    "float": lambda obj, r: float(obj),
}
_ARGUMENTS = ("args", "kwargs", "key", "value")


def _serve(namespace: dict, send, receive, wire) -> None:
    """Answer the judge's requests until it closes the pipe (see the module docstring)."""
    objects: list = []

    def other(value):
        module = getattr(type(value), "__module__", "") or ""
        if module.split(".")[0] == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
            return wire.encode(value.tolist(), other)
        objects.append(value)
        return {"h": len(objects) - 1}

    def resolve(i: int):
        return objects[i]

    names = {k: v for k, v in namespace.items() if not k.startswith("__")}
    send({"loaded": wire.encode(names, other)})
    while (request := receive()) is not None:
        answer = {"id": request.get("id")}
        try:
            args = {k: wire.decode(request[k], resolve) for k in _ARGUMENTS if k in request}
            result = _OPS[request["op"]](objects[request["h"]], {**request, **args})
            answer["ok"] = wire.encode(result, other)
            if request["op"] == "call":  # the arguments after the call: the judge copies back what changed
                answer["after"] = [wire.encode(a, other) for a in args["args"]]
        except BaseException as e:  # noqa: BLE001 - the code's exception, reported as its answer
            answer = {"id": request.get("id"), "raise": type(e).__name__, "message": _describe(e)}
        send(answer)
    os._exit(0)  # skip interpreter shutdown: atexit handlers and finalizers of the code do not run


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
