"""Plain data on the wire between the judge and the box: one JSON message per line, both ways.

Both sides import this file (the box by path, see ``child.py``), so it uses the standard library only.
What may cross is *plain data*: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``complex``
and lists, tuples, dicts, sets and frozensets of them, each rebuilt by the receiver from its exact
built-in type. Anything else the box holds (a function, a class, an instance, a generator) crosses as
a *handle*, ``{"h": <id>}``, which only names the object inside the box.

Encoding on the box's side may be generous (numpy scalars and arrays become numbers and lists): the box
is untrusted anyway, and whatever it sends is simply its answer. Decoding on the judge's side is
strict: it builds only exact built-in types, so no object of the code's ever reaches the judge.
"""

from __future__ import annotations

import json

MAX_MESSAGE_BYTES = 1 << 20
"""The longest message either side reads (a call's result included); longer ones end the run of the box."""
_TAGS = ("list", "tuple", "set", "frozenset", "dict", "bytes", "complex", "h")


class WireError(ValueError):
    """A message that is not well-formed plain data (the box's fault: its answer counts as wrong)."""


def encode(value, other):
    """``value`` as a JSON-able structure; ``other(obj)`` encodes each object in it that is not plain data
    (as a handle ``{"h": id}``, or by converting it, or by raising ``TypeError``)."""
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    if t is list or t is tuple or t is set or t is frozenset:
        return {t.__name__: [encode(v, other) for v in value]}
    if t is dict:
        return {"dict": [[encode(k, other), encode(v, other)] for k, v in value.items()]}
    if t is bytes:
        return {"bytes": value.hex()}
    if t is complex:
        return {"complex": [value.real, value.imag]}
    return other(value)


def decode(value, resolve):
    """The plain data ``value`` encodes, built from exact built-in types; ``resolve(id)`` gives the object
    for a handle. Raises :class:`WireError` for anything else."""
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    if t is not dict or len(value) != 1:
        raise WireError(f"not plain data: {value!r:.80}")
    (tag, inner), = value.items()
    try:
        if tag == "h":
            if type(inner) is not int:
                raise WireError("a handle is an integer")
            return resolve(inner)
        if tag == "bytes":
            return bytes.fromhex(inner)
        if tag == "complex":
            re, im = inner
            if type(re) is not float or type(im) is not float:
                raise WireError("complex parts are floats")
            return complex(re, im)
        if tag not in _TAGS or type(inner) is not list:
            raise WireError(f"unknown tag {tag!r:.40}")
        if tag == "dict":
            return {decode(k, resolve): decode(v, resolve) for k, v in inner}
        items = [decode(v, resolve) for v in inner]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    except WireError:
        raise
    except (TypeError, ValueError, RecursionError) as e:  # unhashable keys, bad hex, wrong shapes, nesting
        raise WireError(f"not plain data ({type(e).__name__}: {e})") from None


def dumps(message: dict) -> bytes:
    """One line: ``message`` as JSON (NaN and infinities allowed) and a newline."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def loads(line: bytes) -> dict:
    """The message of one line; :class:`WireError` if it is not a JSON object."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as e:  # ints beyond the digit limit are ValueErrors too
        raise WireError(f"not a JSON message ({type(e).__name__})") from None
    if type(message) is not dict:
        raise WireError("a message is a JSON object")
    return message


class Lines:
    """Reads whole lines from a file descriptor, at most :data:`MAX_MESSAGE_BYTES` each."""

    def __init__(self, fd: int):
        self.fd, self.buffer = fd, b""

    def pending(self) -> bytes | None:
        """A complete line already buffered, or None."""
        end = self.buffer.find(b"\n")
        if end < 0:
            if len(self.buffer) > MAX_MESSAGE_BYTES:
                raise WireError(f"a message longer than {MAX_MESSAGE_BYTES} bytes")
            return None
        line, self.buffer = self.buffer[:end], self.buffer[end + 1:]
        return line

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
