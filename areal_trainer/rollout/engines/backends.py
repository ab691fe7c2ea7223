"""The rollout backends, in one registry that validation and construction both read.

Every backend is an :class:`~areal_trainer.rollout.types.InferenceEngine`: ``generate(prompts,
gconfig) -> list[Generation]`` (per-token behaviour logprobs and policy versions), ``version``, and
``update_weights(model, version)``, which the trainer calls after every optimizer update so the
next rollout samples from the new policy. :data:`ENGINES` says what each one can do; the start-up
checks (``components/rollout.py``) and the rollout's construction (``train/sources/build.py``) decide from
those flags, never from a backend's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineSpec:
    """A rollout backend and what it can do.

    Attributes:
        make: ``make(model, tokenizer, *, device, autocast_dtype, seed, dtype, batch_size, interruptible,
            share_prefill, stoppable, **kwargs) -> engine``.
        holds_own_weights: the engine keeps its own copy of the weights (``update_weights`` copies them in);
            otherwise it samples from the trainer's model object itself.
        supports_fsdp: it works with a policy sharded by FSDP2 (``parallel.fsdp``).
        can_switch_mid_call: a weight switch can land inside a ``generate`` call (reproducible off-policy
            runs with ``rollout.lagged_switch_prob > 0``).
        extra_kwargs_key: the config key of extra constructor arguments (``rollout.vllm_kwargs``), or "".
        servers: the engine samples on inference server processes (``rollout/servers/``): its ``make`` also takes
            the run directory (``work_dir``) and the process group (``dist``).
        takes_images: its ``generate`` takes each prompt's images (``vision=``, ``model/vision.py``), so it can
            sample from an image-text-to-text model on image prompts (docs/vlm.md).
    """

    make: Callable[..., Any]
    holds_own_weights: bool
    supports_fsdp: bool
    can_switch_mid_call: bool
    extra_kwargs_key: str = ""
    servers: bool = False
    takes_images: bool = False


def _make_hf(model, tokenizer, *, device, autocast_dtype, seed, dtype, batch_size, interruptible, share_prefill,
             stoppable, **kwargs):
    from .hf import HFEngine
    from .weights import rollout_copy

    if dtype is not None or stoppable:  # its own copy of the weights (a rollout precision, or a rollout thread)
        model = rollout_copy(model, dtype)
        autocast_dtype = None if dtype is not None else autocast_dtype
    return HFEngine(model, tokenizer, device=device, autocast_dtype=autocast_dtype, batch_size=batch_size,
                    stoppable=stoppable, interruptible=interruptible, share_prefill=share_prefill)


def _make_vllm(model, tokenizer, *, device, autocast_dtype, seed, dtype, batch_size, interruptible, share_prefill,
               stoppable, **kwargs):
    from .vllm import VLLMEngine

    return VLLMEngine(model, tokenizer, device=device, seed=seed, dtype=dtype, interruptible=interruptible, **kwargs)


ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec(_make_hf, holds_own_weights=False, supports_fsdp=True, can_switch_mid_call=True,
                     takes_images=True),
    "vllm": EngineSpec(_make_vllm, holds_own_weights=True, supports_fsdp=False, can_switch_mid_call=False,
                       extra_kwargs_key="rollout.vllm_kwargs"),
}
"""The backends ``rollout.backend`` names."""
