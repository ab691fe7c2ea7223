"""What travels between the trainer and an inference server, as JSON over HTTP (both sides use these).

Token ids in, token ids out: a request carries prompts as token ids and the sampling settings; the answer
carries, per prompt, the sampled ids, each token's behaviour log-probability and the policy version of the
weights that sampled it, exactly what an in-process engine returns (``rollout/types.py::Generation``). Nothing
is re-tokenised on either side.

Routes (``rollout/servers/app.py`` serves them):

* ``GET /health``: ``{"status": "ok", "version": v, "engine": name, "pid": pid, "seeded": bool}``;
* ``POST /generate``: ``{"prompts": [[id, ...], ...], "gconfig": {...}, "seed": int | null}`` ->
  ``{"generations": [{"output_ids", "logprobs", "truncated", "versions"}, ...], "version": v}``;
  with a seed, the server seeds its sampler with it first, so the answer depends only on the seed, the weights
  and the prompts, not on which server ran it or what it ran before;
* ``POST /update_weights/disk``: ``{"path": dir, "version": v}``: load every ``*.safetensors`` file of ``dir``;
* ``POST /update_weights/group/init``: ``{"host", "port", "rank", "world_size", "backend", "timeout", "group"}``:
  join the trainer's weight group (``rollout/servers/group.py``);
* ``POST /update_weights/group``: ``{"version": v, "tensors": [[name, shape, dtype], ...], "buckets": [n, ...]}``:
  receive the weights, bucket by bucket, by broadcast from rank 0 of the group;
* ``POST /schedule_update``: ``{"path": dir, "version": v, "after_tokens": n}``: the next generate call switches to
  these weights after ``n`` new tokens (reproducible off-policy runs);
* ``POST /abort``: stop generating, now and later (the run is ending).

Errors are ``{"error": {"message": ..., "type": ...}}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from ..types import Generation

GCONFIG_FIELDS = ("n_samples", "max_new_tokens", "min_new_tokens", "max_tokens", "greedy", "top_p", "top_k",
                  "temperature", "stop_token_ids", "stop")
"""The sampling settings an engine reads (``gconfig``), sent with every request."""


def gconfig_to_json(gconfig: Any) -> dict[str, Any]:
    """The sampling settings of ``gconfig`` (a dataclass or any object with these attributes) as plain JSON."""
    if dataclasses.is_dataclass(gconfig):
        values = dataclasses.asdict(gconfig)
    else:
        values = {k: getattr(gconfig, k) for k in GCONFIG_FIELDS if hasattr(gconfig, k)}
    return {k: (list(v) if isinstance(v, list | tuple) else v) for k, v in values.items() if k in GCONFIG_FIELDS}


def gconfig_from_json(values: dict[str, Any]) -> SimpleNamespace:
    """The server's view of the sampling settings: an object with the same attributes."""
    unknown = sorted(set(values) - set(GCONFIG_FIELDS))
    if unknown:
        raise ValueError(f"unknown sampling settings {unknown}; known: {list(GCONFIG_FIELDS)}")
    return SimpleNamespace(**values)


def generation_to_json(gen: Generation) -> dict[str, Any]:
    return {"output_ids": [int(t) for t in gen.output_ids], "logprobs": [float(x) for x in gen.logprobs],
            "truncated": bool(gen.truncated), "versions": [int(v) for v in gen.versions]}


def generation_from_json(obj: dict[str, Any]) -> Generation:
    """A :class:`Generation` from a server's answer; raises ``ValueError`` naming what is malformed."""
    try:
        ids, logprobs, versions = list(obj["output_ids"]), list(obj["logprobs"]), list(obj["versions"])
        truncated = obj["truncated"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"a generation lacks {e}") from None
    if not (len(ids) == len(logprobs) == len(versions)):
        raise ValueError(f"a generation has {len(ids)} tokens, {len(logprobs)} log-probs and {len(versions)} versions")
    if not all(isinstance(t, int) for t in ids) or not isinstance(truncated, bool):
        raise ValueError("a generation's output_ids must be integers and truncated a boolean")
    return Generation(ids, [float(x) for x in logprobs], truncated, [int(v) for v in versions])


def error_body(message: str, kind: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool")
"""Tensor dtypes a weight group sends by name."""
