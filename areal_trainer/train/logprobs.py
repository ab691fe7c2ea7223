"""Log-probabilities (and entropy) of the next token from a causal LM, next-token aligned:
position ``t`` holds ``log pi(x_{t+1} | x_<=t)``; the last real position and padding hold 0.

The vocabulary projection runs on chunks of real (non-padding) positions only, so at most
``chunk_size x vocab`` logits exist at a time. With gradients, each chunk is checkpointed: only
the hidden states are kept for backward and the chunk's logits are recomputed there.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
           temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(h, weight, bias).float() / temperature  # [n, V]
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, labels[:, None]).squeeze(-1) - lse
    if with_entropy:
        with torch.no_grad():
            p = torch.softmax(logits, dim=-1)
            ent = lse - (p * logits).sum(-1)
    else:
        ent = torch.zeros_like(lse)
    return logp, ent.detach()


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, *,
                     temperature: float = 1.0, with_entropy: bool = False, chunk_size: int = 1024
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``labels`` and entropy for ``hidden`` ``[N, H]`` -> two ``[N]`` tensors."""
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, ents = [], []
    for i in range(0, hidden.shape[0], chunk_size):
        args = (hidden[i:i + chunk_size], weight, bias, labels[i:i + chunk_size], temperature, with_entropy)
        lp, ent = checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        z = hidden.new_zeros(0, dtype=torch.float32)
        return z, z
    return torch.cat(logps), torch.cat(ents)


def next_token_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` bool: position t is real and so is t+1 (its next token exists)."""
    am = attention_mask.bool()
    nxt = torch.zeros_like(am)
    nxt[:, :-1] = am[:, 1:]
    return am & nxt


def forward_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float,
                     with_entropy: bool = False, chunk_size: int = 1024,
                     autocast_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, S]`` next-token-aligned log-probabilities and entropies of a right-padded batch."""
    device = input_ids.device
    ctx = torch.autocast(device.type, autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    valid = next_token_mask(attention_mask)
    labels = torch.roll(input_ids, -1, dims=1)[valid]
    head = model.get_output_embeddings()
    special_head = getattr(model.config, "final_logit_softcapping", None) or getattr(model.config, "logit_scale", None)
    with ctx:
        if special_head or not isinstance(head, torch.nn.Linear):
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[valid].float() / temperature
            lse = torch.logsumexp(logits, -1)
            lp = logits.gather(-1, labels[:, None]).squeeze(-1) - lse
            ent = (lse - (torch.softmax(logits, -1) * logits).sum(-1)).detach() if with_entropy else torch.zeros_like(lp)
        else:
            hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            lp, ent = chunked_logprobs(hidden[valid], head.weight, head.bias, labels, temperature=temperature,
                                       with_entropy=with_entropy, chunk_size=chunk_size)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
    entropy = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
    logp = logp.masked_scatter(valid, lp.float())
    entropy = entropy.masked_scatter(valid, ent.float())
    return logp, entropy
