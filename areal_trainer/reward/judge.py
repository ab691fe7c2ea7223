"""The judge: runs a row's tests in the trainer's reward process, calling into the box for the solution.

The generated code runs in the box (``box/child.py``); the tests never do. Each test statement runs
here, in a namespace where the names the code defined are either their plain values (numbers, strings,
containers of them, read once after the code ran) or :class:`Handle` objects standing for what the code
holds (functions, classes, instances, modules). Calling a handle, reading its attributes or items,
iterating it, taking its ``len``, ``str``, ``int`` or ``float``, asks the box; what comes back is plain
data built here from exact built-in types (``box/wire.py``) or another handle. So every comparison a
test makes is between the judge's own values: an object whose ``__eq__`` is always true, patched
builtins, an early ``exit`` with success or lines written to any file descriptor cannot make a test
pass. A handle compares equal only to itself and refuses to be taken as true or false.

A test passes when its statement runs to the end. It fails when it raises (an exception the code
raised in a call is raised here as the built-in exception of that name, else as :class:`SolutionError`),
or when the box ends, stops answering or sends anything but plain data during the test: that is
:class:`BoxGone`, a ``BaseException``, so a test's ``except Exception`` cannot take it for the
exception it expects. Arguments passed into a call must be plain data or handles; lists, dicts and
sets passed in are updated in place afterwards with the box's copies (a test of an in-place sort works).
Names of built-ins (``len``, ``sorted``) always mean the built-ins in a test, even where the code
defined its own.
"""

from __future__ import annotations

import builtins
import os
import select
import time

from .box import wire


class BoxGone(BaseException):
    """The box ended, timed out or broke the protocol: the running test, and every later one, fails."""


class SolutionError(Exception):
    """An exception raised in the code that has no built-in exception of its name."""


class Box:
    """The judge's end of one box's pipes, with the run's deadline."""

    def __init__(self, request_fd: int, answer_fd: int, deadline: float):
        self.request_fd, self.deadline = request_fd, deadline
        self.lines = wire.Lines(answer_fd)
        self.answer_fd = answer_fd
        self.gone: str | None = None
        self._next_id = 0

    def receive(self) -> dict:
        """The next message from the box; :class:`BoxGone` at end of file, past the deadline or on bad data."""
        if self.gone:
            raise BoxGone(self.gone)
        try:
            while (line := self.lines.pending()) is None:
                left = self.deadline - time.monotonic()
                if left <= 0 or not select.select([self.answer_fd], [], [], left)[0]:
                    raise BoxGone("the time limit was reached")
                chunk = os.read(self.answer_fd, 65536)
                if not chunk:
                    raise BoxGone("the code's process ended")
                self.lines.feed(chunk)
            return wire.loads(line)
        except wire.WireError as e:
            self.gone = f"the box sent something other than plain data: {e}"
        except BoxGone as e:
            self.gone = str(e)
        raise BoxGone(self.gone)

    def request(self, op: str, handle: int, **fields):
        """Ask the box to apply ``op`` to the object ``handle`` names; its result (plain data or a handle)."""
        if self.gone:
            raise BoxGone(self.gone)
        self._next_id += 1
        message = {"id": self._next_id, "op": op, "h": handle,
                   **{k: wire.encode(v, _encode_handle) for k, v in fields.items()}}
        try:
            data = wire.dumps(message)
            while data:
                data = data[os.write(self.request_fd, data):]
        except OSError:
            self.gone = "the code's process ended"
            raise BoxGone(self.gone) from None
        answer = self.receive()
        if answer.get("id") != self._next_id:
            self.gone = "the box answered out of turn"
            raise BoxGone(self.gone)
        if "raise" in answer:
            raise _exception(answer.get("raise"), answer.get("message"))
        result = self.decode(answer.get("ok"))
        if op == "call":
            _copy_back(fields.get("args", ()), answer.get("after"), self)
        return result

    def decode(self, value):
        try:
            return wire.decode(value, lambda i: Handle(self, i))
        except wire.WireError as e:
            self.gone = f"the box sent something other than plain data: {e}"
            raise BoxGone(self.gone) from None


def _encode_handle(value):
    if type(value) is Handle:
        return {"h": object.__getattribute__(value, "_id")}
    raise TypeError("a test can pass only plain data and the solution's own objects into it, "
                    f"not {type(value).__name__}")


def _exception(name, message) -> Exception:
    """The built-in exception named ``name`` (an ``Exception`` subclass), else :class:`SolutionError`."""
    text = message if isinstance(message, str) else ""
    cls = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(text)
        except Exception:  # noqa: BLE001 - an exception class with other constructor arguments
            pass
    return SolutionError(text)


def _copy_back(args, after, box: Box) -> None:
    """Update the lists, dicts and sets a test passed into a call with their state in the box after it."""
    if not isinstance(after, list) or len(after) != len(args):
        return
    for arg, new in zip(args, after):
        if type(arg) in (list, dict, set):
            value = box.decode(new)
            if type(value) is type(arg):
                if type(arg) is list:
                    arg[:] = value
                else:
                    arg.clear()
                    arg.update(value)


class Handle:
    """An object of the code's, inside the box (see the module docstring)."""

    __slots__ = ("_box", "_id")

    def __init__(self, box: Box, id_: int):
        object.__setattr__(self, "_box", box)
        object.__setattr__(self, "_id", id_)

    def _ask(self, op: str, **fields):
        return object.__getattribute__(self, "_box").request(op, object.__getattribute__(self, "_id"), **fields)

    def __call__(self, *args, **kwargs):
        return self._ask("call", args=list(args), kwargs=kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name: str, value) -> None:
        self._ask("setattr", name=name, value=value)

    def __getitem__(self, key):
        return self._ask("getitem", key=key)

    def __setitem__(self, key, value) -> None:
        self._ask("setitem", key=key, value=value)

    def __iter__(self):
        return iter(_typed(self._ask("list"), list, "iterating"))

    def __next__(self):
        return self._ask("next")

    def __len__(self) -> int:
        return _typed(self._ask("len"), int, "len()")

    def __contains__(self, key) -> bool:
        return _typed(self._ask("contains", key=key), bool, "in")

    def __str__(self) -> str:
        return _typed(self._ask("str"), str, "str()")

    def __repr__(self) -> str:
        return _typed(self._ask("repr"), str, "repr()")

    def __int__(self) -> int:
        return _typed(self._ask("int"), int, "int()")

    __index__ = __int__

    def __float__(self) -> float:
        return _typed(self._ask("float"), float, "float()")

    def __bool__(self) -> bool:
        raise TypeError("an object of the solution's is not taken as true or false on its word: return a bool")

    def __eq__(self, other) -> bool:
        return self is other

    def __ne__(self, other) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return object.__hash__(self)


def _typed(value, expected: type, what: str):
    if type(value) is not expected:
        raise TypeError(f"{what} of an object of the solution's gave {type(value).__name__}, not {expected.__name__}")
    return value


def run_tests(box: Box, names, tests: list[str]) -> list[bool]:
    """Whether each test statement runs to the end in a namespace of the solution's ``names`` (the box's
    ``loaded`` message); see the module docstring."""
    namespace = {"__name__": "__tests__", "__builtins__": builtins}
    defined = box.decode(names)
    if type(defined) is dict:
        # Never over a built-in: a solution's own ``sorted`` or ``len`` would otherwise answer for the test.
        namespace.update({k: v for k, v in defined.items()
                          if type(k) is str and not k.startswith("__") and not hasattr(builtins, k)})
    passed = []
    for i, test in enumerate(tests):
        if box.gone:
            passed.append(False)
            continue
        try:
            exec(compile(test, f"<test {i}>", "exec"), namespace)
            passed.append(not box.gone)
        except BaseException:  # noqa: BLE001 - a failing, raising or exiting test (the data's) counts as failed
            passed.append(False)
    return passed
