"""The cache of the supervised warm start (``sft.py``): a built-in model's warm start depends only on its
settings, the code that computes it and the float kernels, so an identical one is stored once and reused
(``sft_warmup.cache``), under ``$AREAL_TRAINER_CACHE/warmstart/<key>``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import torch

from .. import faults
from .state import manifest


def cache_root() -> str:
    return os.environ.get("AREAL_TRAINER_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "areal_trainer"))


def warmstart_key(parts: dict) -> str:
    """A key for the warm-start cache: the settings plus the source of every module that shapes the
    result (the task generator, the built-in model and tokenizer, the training forward, this file),
    so edits invalidate it."""
    from ..data import arith, pictures, vision
    from ..model import builtin, builtin_vlm, packing
    from ..model import vision as model_vision
    from .models import logprobs

    sft = os.path.join(os.path.dirname(__file__), "sft.py")
    h = hashlib.sha256(json.dumps({**parts, "kernels": kernel_identity()}, sort_keys=True, default=str).encode())
    for path in (arith.__file__, builtin.__file__, builtin.VOCAB_FILE, logprobs.__file__, packing.__file__, sft,
                 pictures.__file__, vision.__file__, builtin_vlm.__file__, model_vision.__file__):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(torch.__version__.encode())
    return h.hexdigest()[:24]


def kernel_identity() -> dict:
    """What decides the float kernels' summation order, and so the warm start's last bits: the CPU kernels
    torch dispatches to (``ATEN_CPU_CAPABILITY`` included), the intra-op thread count, and the GPU model.
    A warm start computed under other kernels is another warm start (runs diverge from there), so it is
    never reused for these."""
    out = {"cpu": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def load_cached(model, key: str) -> dict | None:
    """Load a cached warm start into ``model``; returns its recorded metrics, or None if absent. A damaged
    entry (its files differ from its manifest, or do not load) is removed with a warning: it is recomputed."""
    path = os.path.join(cache_root(), "warmstart", key)
    if not os.path.isfile(os.path.join(path, "metrics.json")):
        return None
    wrong = manifest.problem(path)
    if wrong is None:
        try:
            state = torch.load(os.path.join(path, "model.pt"), weights_only=True)
            with open(os.path.join(path, "metrics.json")) as f:
                metrics = json.load(f)
            model.load_state_dict(state)
            return metrics
        except (OSError, RuntimeError, ValueError, EOFError) as e:  # torch reports a bad file as any of these
            wrong = f"it does not load ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
    print(f"warning: the cached warm start {path} is damaged: {wrong}; removing it and computing the warm start "
          "again.", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    return None


def store_cached(model, key: str, metrics: dict) -> None:
    """Write the warm start atomically: the weights and a manifest, metrics.json last, then rename. A cache
    that cannot be written (a full disk, no permission) costs only the cache: one warning line naming the
    path, the free space and the size needed, and the run goes on."""
    root = os.path.join(cache_root(), "warmstart")
    tmp = os.path.join(root, f".tmp-{key}-{os.getpid()}")
    try:
        os.makedirs(tmp, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
        manifest.write(tmp)
        faults.point("warmstart.before_marker")
        with open(os.path.join(tmp, "metrics.json"), "w") as f:
            json.dump(metrics, f)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"warning: {_cache_failure(root, model, e)}", file=sys.stderr, flush=True)
        return
    final = os.path.join(root, key)
    try:
        os.rename(tmp, final)
    except OSError:  # another process stored the same warm start first
        shutil.rmtree(tmp, ignore_errors=True)


def _cache_failure(root: str, model, err: BaseException) -> str:
    """One line: why the warm start could not be cached, the free space and what it needs."""
    need = _bytes(sum(t.numel() * t.element_size() for t in model.state_dict().values()))
    try:
        free = _bytes(shutil.disk_usage(root if os.path.isdir(root) else cache_root()).free)
    except OSError:
        free = "unknown"
    why = " ".join(str(err).split())[:200] or type(err).__name__
    return (f"cannot store the warm start in the cache {root}: {type(err).__name__}: {why}. Free space there: "
            f"{free}; it needs about {need}. The run goes on without it (the next run trains its "
            "warm start again); free some space or point AREAL_TRAINER_CACHE elsewhere.")


def _bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
