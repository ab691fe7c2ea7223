"""Throughput a GPU user can compare: tokens per second of generation and of training, the weight push, and the
model FLOPs utilisation (MFU) of the training part of a step.

FLOPs are counted the usual way (the formula is the metric's definition, so numbers compare across runs and
frameworks): a forward pass costs ``2 N + 4 L d S`` per token (``N`` parameters, ``L`` layers, hidden size ``d``,
``S`` the mean row length: the matrix products of the weights plus the attention scores and their weighted sum),
a forward and backward pass three times that. A step's training FLOPs are the policy's update (forward and
backward) plus its other forwards over the same tokens (recomputed log-probs, the reference policy), each on the
real (unpadded) tokens of the batch. MFU divides them by the seconds of the training part of the step
(``time/logprobs + time/advantage + time/update``) and the device's peak dense bf16 FLOP/s
(:data:`PEAK_TFLOPS`, by the CUDA device's name); a device not in the table (a CPU) gets ``perf/tflops`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PEAK_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0,
               "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L40": 181.0, "A10G": 70.0,
               "RTX 4090": 165.0, "RTX 3090": 71.0}
"""Peak dense bf16 tensor-core TFLOP/s by a substring of ``torch.cuda.get_device_name()`` (first match, in order)."""


def peak_tflops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, value in PEAK_TFLOPS.items():
        if key in device_name:
            return value
    return None


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs count needs of the policy."""

    params: int
    layers: int
    hidden: int

    @staticmethod
    def of(model) -> ModelShape:
        config = getattr(model, "config", None)
        if callable(getattr(config, "get_text_config", None)):  # a VLM's attention cost is its language model's
            config = config.get_text_config()
        params = sum(p.numel() for p in model.parameters())
        return ModelShape(params, int(getattr(config, "num_hidden_layers", 0) or 0),
                          int(getattr(config, "hidden_size", 0) or 0))

    def forward_flops(self, tokens: float, mean_len: float) -> float:
        """FLOPs of one forward pass over ``tokens`` tokens in rows of ``mean_len`` tokens."""
        return tokens * (2.0 * self.params + 4.0 * self.layers * self.hidden * mean_len)


def step_perf(shape: ModelShape, *, tokens: float, rows: float, sampled: float, times: Mapping[str, float],
              extra_forwards: int, peak: float | None) -> dict[str, float]:
    """The ``perf/*`` metrics of one step on one process.

    Args:
        shape: the policy's parameters, layers and hidden size.
        tokens: real tokens of the trained batch; ``rows``: its rows; ``sampled``: its sampled (trained) tokens.
        times: the step's ``time/*`` metrics (seconds).
        extra_forwards: forwards of the policy's size over the batch besides the update (log-prob recompute,
            reference policy).
        peak: the device's peak TFLOP/s, or None.
    """
    out: dict[str, float] = {}
    gen = times.get("time/generation", times.get("time/rollout", 0.0))
    if gen > 0 and sampled > 0:
        out["perf/gen_tokens_per_s"] = sampled / gen
    train = sum(times.get(k, 0.0) for k in ("time/logprobs", "time/advantage", "time/update"))
    if train > 0 and tokens > 0:
        out["perf/train_tokens_per_s"] = tokens / train
        mean_len = tokens / max(rows, 1.0)
        flops = shape.forward_flops(tokens, mean_len) * (3 + extra_forwards)
        out["perf/tflops"] = flops / train / 1e12
        if peak:
            out["perf/mfu"] = flops / train / (peak * 1e12)
    return out
