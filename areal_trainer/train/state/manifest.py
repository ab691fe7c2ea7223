"""A checkpoint's manifest: every file's size and SHA-256, written before the checkpoint is marked
complete, so that a damaged checkpoint (a truncated file, a missing one, flipped bytes) is found
before anything loads from it, named, and skipped.

``MANIFEST.json`` is ``{"files": {"<relative path>": {"size": int, "sha256": hex}}}``. Checking reads
every file once (about 1 s per GB); sizes are compared first, so a truncated or missing file is found
without reading anything.
"""

from __future__ import annotations

import hashlib
import json
import os

MANIFEST = "MANIFEST.json"
_CHUNK = 1 << 20


def _files(root: str) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
    return sorted(out)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write(root: str, exclude: tuple[str, ...] = ()) -> None:
    """Write ``root/MANIFEST.json`` for every file under ``root`` but ``exclude`` (and the manifest)."""
    files = {rel: {"size": os.path.getsize(os.path.join(root, rel)), "sha256": sha256(os.path.join(root, rel))}
             for rel in _files(root) if rel != MANIFEST and rel not in exclude}
    with open(os.path.join(root, MANIFEST), "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def problem(root: str, under: str = "") -> str | None:
    """What is wrong with the files under ``root`` against its manifest, in a few words naming the file
    (None when they match; also None for a checkpoint written before manifests existed). ``under``: only
    the files in that subdirectory (one model of a checkpoint)."""
    path = os.path.join(root, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    if under:
        files = {rel: want for rel, want in files.items() if rel.startswith(under.rstrip("/") + "/")}
    for rel, want in files.items():
        full = os.path.join(root, rel)
        if not os.path.isfile(full):
            return f"{rel} is missing"
        size = os.path.getsize(full)
        if size != want["size"]:
            return f"{rel} has {size} bytes, {want['size']} were written"
    for rel, want in files.items():
        if sha256(os.path.join(root, rel)) != want["sha256"]:
            return f"{rel} has the right size but other contents than were written (checksum mismatch)"
    return None


def model_problem(path: str) -> str | None:
    """For a model directory inside a checkpoint (``.../step_<N>/actor``, the path a user gives as
    ``actor.path`` or a teacher's), what is wrong with its files against the checkpoint's manifest;
    None elsewhere or when they match."""
    path = os.path.abspath(path)
    root, name = os.path.dirname(path), os.path.basename(path)
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(root, MANIFEST)):
        return None
    return problem(root, under=name)
