"""Reading rows from local files, with errors that name the file and the line.

``dataset.path`` may be a file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``), a directory (every such
file in it, in name order) or a glob (``data/train-*.jsonl``). Each row is a dict of columns, and
knows where it came from (:class:`Row`: the file and its line number, or its row number), so that a
later problem with its contents can point at it.

JSON and JSON Lines are read here, line by line, so that an empty file, bytes that are not UTF-8 and
a line that is not JSON each become one message naming the file and the line. Parquet and CSV are read
with pyarrow; a file that is not what its extension says is reported the same way.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Any

from ..errors import UserError

FORMATS = (".jsonl", ".json", ".parquet", ".csv")


@dataclass(frozen=True)
class Row:
    """A row's columns and where it came from: ``where`` reads "line 7 of 'train.jsonl'" (or "row 7")."""

    columns: dict[str, Any]
    where: str
    base: str | None = None
    """The directory of the file it came from: relative image paths (``data/vision.py``) start there."""


def local_files(path: str, key: str) -> list[str] | None:
    """The files ``path`` names (a file, a directory or a glob), or None when it is not a local path."""
    expanded = os.path.expanduser(path)
    if os.path.isfile(expanded):
        return [expanded]
    if os.path.isdir(expanded):
        files = sorted(f for f in glob.glob(os.path.join(expanded, "*")) if f.lower().endswith(FORMATS))
        if not files:
            raise UserError(f"{key}: the directory {path!r} holds no {', '.join(FORMATS)} file.")
        return files
    if any(c in path for c in "*?["):
        files = sorted(glob.glob(expanded))
        if not files:
            raise UserError(f"{key}: the pattern {path!r} matches no file.")
        return files
    if path.startswith((".", "/", "~")):
        raise UserError(f"{key}: {path!r} does not exist.")
    return None


def read_files(files: list[str], key: str) -> list[Row]:
    rows: list[Row] = []
    for f in files:
        ext = os.path.splitext(f)[1].lower()
        if ext not in FORMATS:
            raise UserError(f"{key}: {f!r} has an unknown extension; use {', '.join(FORMATS)} "
                            "(or a directory of them).")
        got = _read_json(f, key) if ext in (".jsonl", ".json") else _read_table(f, ext, key)
        if not got:
            raise UserError(f"{key}: {f!r} holds no rows (an empty file?).")
        rows += got
    return rows


def _text(path: str, key: str) -> str:
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(f"{key}: {path!r} is not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}, column "
                        f"{column}. Convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8).") from None


def _read_json(path: str, key: str) -> list[Row]:
    """JSON Lines (one object per non-blank line), or one JSON array of objects (``.json``)."""
    text = _text(path, key)
    name = os.path.basename(path)
    if path.lower().endswith(".json") and text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{key}: {path!r} is not valid JSON: {e.msg} at line {e.lineno}, "
                            f"column {e.colno}.") from None
        return [_object(r, f"element {i + 1} of {name!r}", key, path) for i, r in enumerate(data)]
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{key}: line {n} of {path!r} is not valid JSON ({e.msg}, column {e.colno}): "
                            f"{line[:120]!r}. Fix the line or remove it.") from None
        rows.append(_object(value, f"line {n} of {name!r}", key, path))
    return rows


def _object(value: Any, where: str, key: str, path: str) -> Row:
    if not isinstance(value, dict):
        raise UserError(f"{key}: {where} is a {type(value).__name__}, not an object of columns "
                        "(e.g. {\"prompt\": ..., \"answer\": ...}).")
    return Row(value, where, os.path.dirname(os.path.abspath(path)))


def _read_table(path: str, ext: str, key: str) -> list[Row]:
    import pyarrow as pa

    try:
        if ext == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(path)
    except (pa.ArrowException, OSError) as e:
        what = "Parquet" if ext == ".parquet" else "CSV"
        raise UserError(f"{key}: {path!r} cannot be read as {what}: {str(e).splitlines()[0]}. Is it really a "
                        f"{ext} file?") from None
    name = os.path.basename(path)
    base = os.path.dirname(os.path.abspath(path))
    return [Row(r, f"row {i + 1} of {name!r}", base) for i, r in enumerate(table.to_pylist())]
