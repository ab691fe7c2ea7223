"""The ``hf`` rollout backend: batched sampling with ``transformers`` ``generate``.

Colocated (synchronous training): the engine samples from the policy object being trained, so new
weights are used as soon as the optimizer steps and ``update_weights`` only records their version.
Separate (asynchronous training, or a rollout precision other than the trainer's): the engine holds
its own copy of the policy (:func:`rollout_copy`) and ``update_weights`` copies the trainer's
weights into it.

Weight updates during a generation. With ``interruptible=True`` an update requested while
``generate`` runs (from another thread) stops the generation at the next token boundary; the
update loads the weights, and every unfinished answer continues from its tokens so far under the
new weights (a partial rollout: the prompt and the answer's first tokens are prefilled again with
the new weights, as inference servers do when a request is aborted and resubmitted). Each token
keeps the version of the weights that sampled it. With ``interruptible=False`` the update waits
until the running ``generate`` call has finished.

Shared prefill. The samples of one prompt arrive as identical rows; their prompt is prefilled once
(all but its last token), the key/value cache is expanded to the rows, and ``generate`` continues
from it, so a step prefills each distinct prompt once instead of ``n_samples`` times. Sampling is
unchanged: the same logits, the same random draws in the same order.

Stop strings (``gconfig.stop``). A row ends once its answer so far (across the segments of a partial
rollout) holds a stop string: a stopping criterion checks the new tokens after every step, and each
answer is then cut after the token that completes the stop string (``stops.py``), as a stop token ends
it. Without stop strings no criterion is added, and the calls are exactly those made before.

Images. An image-text-to-text model's prompts come with their processed images (``vision``: one
``model/vision.py`` ``VisionInput`` per prompt, None for a text prompt; the samples of one prompt share one
object). Each call passes the images of its rows in row order; the shared prefill computes a prompt's images
once with its tokens, and only rows with the same tokens and the same images share it.

Per-token behaviour log-probabilities are those of the temperature-scaled distribution the token
was sampled from (after processors such as ``min_new_tokens``, before top-k/top-p truncation),
recorded one step at a time so no ``[tokens, vocab]`` tensor is ever kept.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import DynamicCache

from ...model.vision import VisionInput, collate, has_images, token_types, uses_3d_positions
from ..limits import new_token_caps, positions_of
from ..types import Generation
from .stops import StopStrings as _StopStrings
from .stops import stop_at, stop_strings
from .weights import GenerationAborted, WeightGate, copy_weights, rollout_copy, snapshot

__all__ = ["Generation", "GenerationAborted", "HFEngine", "copy_weights", "rollout_copy", "snapshot"]


class _RecordLogprobs(LogitsProcessor):
    """Sees each step's scores before temperature/top-k/top-p; gathers the logprob of the token
    chosen at the previous step (visible as the last column of ``input_ids``)."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._gather(input_ids[:, -1])
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _gather(self, tokens: torch.Tensor) -> None:
        if self.prev is not None:
            self.steps.append(self.prev.gather(-1, tokens[:, None]).squeeze(-1))
            self.prev = None

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        self._gather(last_tokens)
        return torch.stack(self.steps, dim=1) if self.steps else last_tokens.new_zeros((len(last_tokens), 0)).float()


class _StopEarly(StoppingCriteria):
    """Ends a ``generate`` call for every row once a weight update is pending or the engine is
    aborted, or after ``limit`` new tokens."""

    def __init__(self, engine: HFEngine, prompt_width: int, limit: int | None):
        self.engine, self.prompt_width, self.limit = engine, prompt_width, limit

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        stop = self.engine.gate.pending() or (
            self.limit is not None and input_ids.shape[1] - self.prompt_width >= self.limit)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


@dataclass
class _Switch:
    """A weight update scheduled to land after ``after_tokens`` new tokens of the next ``generate`` call."""

    after_tokens: int
    model: torch.nn.Module
    version: int


class HFEngine:
    """Samples answers from ``model``; ``version`` is the policy version of its current weights."""

    def __init__(self, model, tokenizer, *, device: torch.device, autocast_dtype: torch.dtype | None = None,
                 batch_size: int | None = None, interruptible: bool = False, stoppable: bool = False,
                 version: int = 0, share_prefill: bool = True):
        self.model, self.tokenizer, self.device, self.autocast_dtype = model, tokenizer, device, autocast_dtype
        self.batch_size = batch_size
        self.share_prefill = share_prefill
        """Prefill identical rows once and expand their key/value cache (see the module docstring)."""
        self.stoppable = stoppable or interruptible
        """Whether generation checks for updates, aborts and scheduled switches at every token."""
        self.gate = WeightGate(version, interruptible)
        self._local = threading.local()
        self._switch: _Switch | None = None
        self.interruptions = 0
        """How many times a running generation was stopped and continued under new weights."""
        self.max_positions = positions_of(model, tokenizer)
        """The model's positions: with ``gconfig.max_tokens``, the limit of prompt + answer (``rollout/limits.py``)."""

    @property
    def version(self) -> int:
        return self.gate.version

    # -- weights ----------------------------------------------------------------------------------
    def update_weights(self, model, version: int) -> None:
        """Sample with ``model``'s weights (a module or a state dict; policy version ``version``) from
        now on. Waits for the running generation step (interruptible) or call (not interruptible)
        to end; the generation then continues under the new weights."""
        def load() -> None:
            if model is not self.model:
                copy_weights(self.model, model)
                if self.device.type == "cuda":  # the copy must land before the rollout's stream reads it
                    torch.cuda.synchronize(self.device)

        self.gate.update(load, version)

    def abort(self) -> None:
        """Stop every generation, now and later (``generate`` raises :class:`GenerationAborted`)."""
        self.gate.abort()

    def schedule_update(self, after_tokens: int, model, version: int) -> None:
        """Let the next ``generate`` call switch to ``model``'s weights after ``after_tokens`` new tokens,
        as a weight update landing mid-generation would (used for reproducible off-policy runs)."""
        self._switch = _Switch(int(after_tokens), model, int(version))

    def _stream(self):
        """On CUDA, a separate engine generates on a stream of its own (one per thread), so that its
        kernels can run alongside the trainer's; the colocated one uses the current stream."""
        if self.device.type != "cuda" or not self.stoppable:
            return contextlib.nullcontext()
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
        return torch.cuda.stream(stream)

    # -- sampling ---------------------------------------------------------------------------------
    def stop_ids(self, gconfig: Any) -> list[int]:
        ids = [self.tokenizer.eos_token_id, *gconfig.stop_token_ids]
        return sorted({i for i in ids if i is not None})

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], gconfig: Any,
                 vision: list[VisionInput | None] | None = None) -> list[Generation]:
        """Sample one answer per prompt (repeat a prompt to sample it several times), each of at most
        ``min(gconfig.max_new_tokens, limit - its prompt tokens)`` tokens (``limits.new_token_caps``).
        ``vision``: each prompt's images (None: a text prompt; see the module docstring)."""
        caps = new_token_caps([len(p) for p in prompts], gconfig, self.max_positions)
        vision = vision if has_images(vision) else None
        out: dict[int, Generation] = {}
        try:
            for rows in self._call_groups(prompts, caps, gconfig):
                step = self.batch_size or len(rows) or 1
                for i in range(0, len(rows), step):
                    chunk = rows[i:i + step]
                    gens = self._generate_chunk([prompts[r] for r in chunk], [caps[r] for r in chunk], gconfig,
                                                None if vision is None else [vision[r] for r in chunk])
                    out.update(zip(chunk, gens))
        finally:
            self._switch = None
        return [out[i] for i in range(len(prompts))]

    def _call_groups(self, prompts: list[list[int]], caps: list[int], g: Any) -> list[list[int]]:
        """The rows generated together, in order. ``generate`` has one ``max_new_tokens`` per call, so
        rows of different caps share a call that runs to the largest cap and each row is cut at its own
        (``_generate_chunk``); when no cap is below ``max_new_tokens`` the calls are exactly those of an
        uncapped engine. A cut row still runs to the call's end: one whose prompt + ``max_new_tokens``
        exceeds the model's positions would reach positions that a learned position table lacks, so such
        rows are generated apart, each with the rows of the same cap (the samples of its prompt)."""
        if self.max_positions is None:
            return [list(range(len(prompts)))]
        apart: dict[int, list[int]] = {}
        shared = []
        for i, p in enumerate(prompts):
            if len(p) + g.max_new_tokens > self.max_positions:
                apart.setdefault(caps[i], []).append(i)
            else:
                shared.append(i)
        return [rows for rows in (shared, *apart.values()) if rows]

    def _generate_chunk(self, prompts: list[list[int]], caps: list[int], g: Any,
                        vision: list[VisionInput | None] | None = None) -> list[Generation]:
        """Segments of ``generate`` until every answer is finished (a stop token, a stop string of
        ``gconfig.stop``, or ``caps[i]`` tokens);
        between two segments a weight update (pending or scheduled) is loaded. Unfinished rows have the
        same number of tokens."""
        stop = set(self.stop_ids(g))
        strings = stop_strings(g)
        ids: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        versions: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        by_string = [False] * len(prompts)
        todo = list(range(len(prompts)))
        while todo:
            n_done = len(ids[todo[0]])
            switch = self._switch if self._switch is not None and self._switch.after_tokens > n_done else None
            limit = switch.after_tokens - n_done if switch is not None else None
            with self.gate.generating() as version:
                new, new_logps = self._sample([list(prompts[i]) + ids[i] for i in todo], g, n_done, limit,
                                              max(caps[i] for i in todo),
                                              ([ids[i] for i in todo], [caps[i] for i in todo]) if strings else None,
                                              None if vision is None else [vision[i] for i in todo])
            for r, i in enumerate(todo):
                room = caps[i] - n_done  # a row of a smaller cap than the call's is cut at its own
                toks, lps = new[r][:room], new_logps[r][:room]
                for k, t in enumerate(toks):
                    if t in stop:
                        toks, lps, done[i] = toks[: k + 1], lps[: k + 1], True
                        break
                if strings:  # the exact cut: nothing after the token that completes a stop string is kept
                    keep = stop_at(self.tokenizer, ids[i] + toks, strings, min_tokens=g.min_new_tokens,
                                   checked=len(ids[i]))
                    if keep is not None:
                        toks, lps = toks[: keep - len(ids[i])], lps[: keep - len(ids[i])]
                        done[i] = by_string[i] = True
                ids[i] += toks
                logps[i] += lps
                versions[i] += [version] * len(toks)
                done[i] = done[i] or len(ids[i]) >= caps[i]
            todo = [i for i in todo if not done[i]]
            if todo and switch is not None and len(ids[todo[0]]) >= switch.after_tokens:
                self._switch = None
                self.update_weights(switch.model, switch.version)
            elif todo:
                self.interruptions += 1
        return [Generation(ids[i], logps[i], truncated=not (by_string[i] or (ids[i] and ids[i][-1] in stop)),
                           versions=versions[i])
                for i in range(len(prompts))]

    def _sample(self, prompts: list[list[int]], g: Any, n_done: int, limit: int | None, most: int,
                answers: tuple[list[list[int]], list[int]] | None = None,
                vision: list[VisionInput | None] | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """One ``generate`` call continuing answers that have ``n_done`` tokens, up to ``most`` tokens in
        all; it stops early (for every row) when a weight update is pending or after ``limit`` new tokens.
        ``answers``: with stop strings, each row's answer so far and cap; a row then ends (and is padded)
        once its answer holds a stop string. ``vision``: each row's images."""
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):  # left padding, so every prompt ends at the same column
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        recorder = _RecordLogprobs(1.0 if g.greedy else g.temperature)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        kwargs = dict(do_sample=not g.greedy, max_new_tokens=most - n_done,
                      min_new_tokens=max(0, min(g.min_new_tokens, most) - n_done), eos_token_id=self.stop_ids(g),
                      pad_token_id=pad, logits_processor=LogitsProcessorList([recorder]))
        criteria = []
        if self.stoppable or limit is not None:
            criteria.append(_StopEarly(self, width, limit))
        if answers is not None:
            criteria.append(_StopStrings(self.tokenizer, stop_strings(g), *answers, width, set(self.stop_ids(g)),
                                         g.min_new_tokens))
        if criteria:
            kwargs["stopping_criteria"] = StoppingCriteriaList(criteria)
        if not g.greedy:
            kwargs.update(temperature=g.temperature, top_p=g.top_p if g.top_p < 1 else None,
                          top_k=g.top_k if 0 < g.top_k < vocab else None)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        was_training = self.model.training
        self.model.eval()
        ctx = torch.autocast(self.device.type, self.autocast_dtype) if self.autocast_dtype else contextlib.nullcontext()
        with ctx, self._stream():  # results are read back on the stream that made them
            ids, mask = ids.to(self.device), mask.to(self.device)
            prefilled = self._shared_prefill(ids, mask, vision) if self.share_prefill else {}
            kwargs.update(prefilled)
            if vision is not None and not prefilled:  # a prefilled cache holds the images already
                kwargs.update(self._pixels(vision), **token_types(self.model, ids))
            seqs = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
            new = seqs[:, width:].cpu()
            recorded = recorder.finish(seqs[:, -1]).cpu()
        self.model.train(was_training)
        return new.tolist(), recorded.tolist()

    def _pixels(self, vision: list[VisionInput | None]) -> dict:
        """The model's image tensors of rows with ``vision``, in row order, on the engine's device."""
        param = next(self.model.parameters())
        return collate(vision, self.device, param.dtype)

    def _shared_prefill(self, ids: torch.Tensor, mask: torch.Tensor,
                        vision: list[VisionInput | None] | None = None) -> dict:
        """``{"past_key_values": cache}`` of the left-padded rows ``ids`` ``[R, W]`` without their last
        column, computed once per distinct row (its tokens and its images) and expanded to all ``R``; ``{}``
        when every row is distinct or there is nothing to prefill. ``generate`` then runs only the last
        prompt token."""
        if ids.shape[1] < 2 or vision is not None and uses_3d_positions(self.model):
            return {}  # 3-D positions (Qwen-VL) are the model's own to compute from the whole prompt
        keyed = ids
        if vision is not None:  # rows with the same tokens but other images are distinct
            owners: dict[int, int] = {}
            which = [owners.setdefault(id(v), len(owners)) for v in vision]
            keyed = torch.cat([ids, torch.tensor(which, device=ids.device)[:, None]], dim=1)
        distinct, inverse = torch.unique(keyed, dim=0, return_inverse=True)
        distinct = distinct[:, : ids.shape[1]]
        if distinct.shape[0] == ids.shape[0]:
            return {}
        first = torch.full((distinct.shape[0],), ids.shape[0], dtype=torch.long, device=ids.device)
        first.scatter_reduce_(0, inverse, torch.arange(ids.shape[0], device=ids.device), reduce="amin")
        u_mask = mask[first, :-1]
        # The positions generate gives left-padded rows (cumulative count of real tokens, pads at 1).
        positions = (u_mask.long().cumsum(-1) - 1).masked_fill_(u_mask == 0, 1)
        cache = DynamicCache(config=self.model.config)
        # The cache argument is `cache` in recent transformers, `past_key_values` before.
        name = "cache" if "cache" in inspect.signature(type(self.model).forward).parameters else "past_key_values"
        pixels = self._pixels([vision[i] for i in first.tolist()]) if vision is not None else {}
        self.model(input_ids=distinct[:, :-1], attention_mask=u_mask, position_ids=positions, use_cache=True,
                   **{name: cache}, **pixels)
        cache.batch_select_indices(inverse)
        return {name: cache}
