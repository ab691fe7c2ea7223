"""The ``hf`` rollout backend: batched sampling with ``transformers`` ``generate`` on the policy
being trained (colocated, so new weights are used as soon as the optimizer steps).

Per-token behaviour log-probabilities are those of the temperature-scaled distribution the
token was sampled from (after processors such as ``min_new_tokens``, before top-k/top-p
truncation), recorded one step at a time so no ``[tokens, vocab]`` tensor is ever kept.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from ..config.schema import GenerationHyperparameters


@dataclass
class Generation:
    """One sampled answer: its tokens (ending with the stop token unless truncated) and logprobs."""

    output_ids: list[int]
    logprobs: list[float]
    truncated: bool


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


class HFEngine:
    """Samples answers from ``model``; ``version`` is the number of weight updates so far."""

    def __init__(self, model, tokenizer, *, device: torch.device, autocast_dtype: torch.dtype | None = None,
                 batch_size: int | None = None):
        self.model, self.tokenizer, self.device, self.autocast_dtype = model, tokenizer, device, autocast_dtype
        self.batch_size = batch_size
        self.version = 0

    def update_weights(self, model) -> None:
        """Nothing to do: this backend samples from the trained model object itself."""

    def stop_ids(self, gconfig: GenerationHyperparameters) -> list[int]:
        ids = [self.tokenizer.eos_token_id, *gconfig.stop_token_ids]
        return sorted({i for i in ids if i is not None})

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], gconfig: GenerationHyperparameters) -> list[Generation]:
        """Sample one answer per prompt (repeat a prompt to sample it several times)."""
        out: list[Generation] = []
        step = self.batch_size or len(prompts) or 1
        for i in range(0, len(prompts), step):
            out += self._generate(prompts[i:i + step], gconfig)
        return out

    def _generate(self, prompts: list[list[int]], g: GenerationHyperparameters) -> list[Generation]:
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):  # left padding, so every prompt ends at the same column
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        stop = self.stop_ids(g)
        recorder = _RecordLogprobs(1.0 if g.greedy else g.temperature)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        kwargs = dict(do_sample=not g.greedy, max_new_tokens=g.max_new_tokens, min_new_tokens=g.min_new_tokens,
                      eos_token_id=stop, pad_token_id=pad, logits_processor=LogitsProcessorList([recorder]))
        if not g.greedy:
            kwargs.update(temperature=g.temperature, top_p=g.top_p if g.top_p < 1 else None,
                          top_k=g.top_k if 0 < g.top_k < vocab else None)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        was_training = self.model.training
        self.model.eval()
        ctx = torch.autocast(self.device.type, self.autocast_dtype) if self.autocast_dtype else contextlib.nullcontext()
        with ctx:
            seqs = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs)
        self.model.train(was_training)
        new = seqs[:, width:].cpu()
        logps = recorder.finish(seqs[:, -1]).cpu()
        return [self._trim(new[r].tolist(), logps[r].tolist(), set(stop)) for r in range(len(prompts))]

    @staticmethod
    def _trim(tokens: list[int], logps: list[float], stop: set[int]) -> Generation:
        for k, t in enumerate(tokens):
            if t in stop:
                return Generation(tokens[: k + 1], logps[: k + 1], truncated=False)
        return Generation(tokens, logps, truncated=True)
