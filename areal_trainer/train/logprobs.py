"""Log-probabilities (and entropy) of the next token from a causal LM, next-token aligned:
position ``t`` holds ``log pi(x_{t+1} | x_<=t)``; the last real position and padding hold 0.

Two things keep the training forward lean:

* **Packing** (``train/packing.py``): the backbone runs only the micro-batch's real tokens, packed
  into rows with ``position_ids`` restarting at every sequence (varlen flash-attention on GPU, the
  block-diagonal causal mask of transformers on sdpa/eager), so no padding token is computed.
  Models that cannot pack fall back to the right-padded forward; outputs are the same ``[B, S]``.
* **Chunked head** (:class:`ChunkedLogProbs`): the vocabulary projection, log-softmax and entropy
  run on ``chunk_size`` tokens at a time (default: 128 MiB of float32 logits per chunk), in one
  reused ``[chunk_size, V]`` buffer (a second one holds ``exp`` for the entropy); no ``[N, V]``
  tensor ever exists. Only the hidden states and the per-token log-partition are saved. Backward
  recomputes each chunk's logits, turns them into the softmax gradient in place, and accumulates
  the hidden and weight gradients chunk by chunk: exact (the recomputation repeats the forward's
  operations bit for bit), at the price of one extra ``[N, H] x [H, V]`` matmul (four instead of
  the three of a plain autograd forward/backward). Tokens whose upstream gradient is exactly 0
  (loss-masked prompt tokens, clipped PPO ratios: ``torch.where`` masking gives exact zeros) are
  left out of the backward, which wins that matmul back in a real policy loss.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .packing import is_varlen, pack, packed_apply, real_token_hidden, use_packing

CHUNK_ELEMENTS = 1 << 25
"""Default chunk budget: ``chunk_size x V`` float32 logits of 128 MiB (1024 tokens at V=32k, 220 at 152k)."""


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per head chunk for a vocabulary of ``vocab_size``: ``2^25 / V``, within [64, 4096]."""
    return max(64, min(4096, CHUNK_ELEMENTS // max(vocab_size, 1)))


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The matmul dtype the head would use: the autocast dtype if autocast is on, else the promoted one."""
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature: float,
                  out: torch.Tensor) -> torch.Tensor:
    """``[n, V]`` float32 ``(h @ w.T + b) / temperature`` written into ``out[:n]`` (a reused buffer, so
    no fresh ``[n, V]`` allocation per chunk); ``h``/``w``/``b`` already in the compute dtype."""
    z = out[: h.shape[0]]
    if w.dtype == torch.float32:
        if b is None:
            torch.mm(h, w.t(), out=z)
        else:
            torch.addmm(b, h, w.t(), out=z)
    else:
        z.copy_(F.linear(h, w, b))
    if temperature != 1.0:
        z.div_(temperature)
    return z


class ChunkedLogProbs(torch.autograd.Function):
    """``(hidden [N, H], weight [V, H], bias [V] | None, labels [N])`` -> ``(logp [N], entropy [N])``.

    ``logp[i] = log_softmax((hidden @ weight.T + bias) / T)[i, labels[i]]`` in float32; the entropy of
    the same distribution is returned detached. Only ``hidden`` and the ``[N]`` log-partition are saved.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature: float, chunk_size: int, with_entropy: bool,
                compute_dtype: torch.dtype):
        n_tok, vocab = hidden.shape[0], weight.shape[0]
        logp = torch.empty(n_tok, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.zeros_like(logp)
        rows = max(1, min(chunk_size, n_tok))
        buf = hidden.new_empty(rows, vocab, dtype=torch.float32)
        buf_p = hidden.new_empty(rows, vocab, dtype=torch.float32) if with_entropy else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute_dtype)
            b = bias.to(compute_dtype) if bias is not None else None
            for s in range(0, n_tok, chunk_size):
                e = min(s + chunk_size, n_tok)
                z = _chunk_logits(hidden[s:e].to(compute_dtype), w, b, temperature, buf)
                m = z.amax(-1, keepdim=True)
                z.sub_(m)  # shifted logits, <= 0
                target = z.gather(-1, labels[s:e, None]).squeeze(-1)
                if with_entropy:
                    p = torch.exp(z, out=buf_p[: e - s])
                    total = p.sum(-1)
                    # H = log Z - sum(exp(z) z) / Z  with shifted logits z and Z = sum exp(z)
                    entropy[s:e] = total.log() - p.mul_(z).sum(-1) / total
                else:
                    total = z.exp_().sum(-1)
                log_total = total.log()
                logp[s:e] = target - log_total
                lse[s:e] = m.squeeze(-1) + log_total
        del buf, buf_p
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.temperature, ctx.chunk_size, ctx.compute_dtype = temperature, chunk_size, compute_dtype
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        full_shape = hidden.shape
        # d logp_i / d raw_logits = (onehot(y_i) - softmax_i) / T, times the upstream g_i. Tokens with
        # g_i == 0 (prompt and other loss-masked tokens, clipped PPO ratios) contribute nothing: skip them.
        scale = grad_logp.float() / ctx.temperature
        rows = None if bool((scale != 0).all()) else scale.nonzero().squeeze(-1)
        if rows is not None:
            hidden, labels, lse, scale = (t.index_select(0, rows) for t in (hidden, labels, lse, scale))
        with torch.autocast(hidden.device.type, enabled=False):
            grad_h, grad_w, grad_b = _head_grads(hidden, weight, bias, labels, lse, scale, ctx.chunk_size,
                                                 ctx.compute_dtype, ctx.temperature, need_h, need_w, need_b)
        if rows is not None and need_h:
            grad_h = grad_h.new_zeros(full_shape).index_copy_(0, rows, grad_h)
        return grad_h, grad_w, grad_b, None, None, None, None, None


def _head_grads(hidden, weight, bias, labels, lse, scale, chunk_size: int, cdt: torch.dtype, temperature: float,
                need_h: bool, need_w: bool, need_b: bool):
    """Gradients of ``sum_i scale_i * T * logp_i`` w.r.t. ``hidden [n, H]``, ``weight``, ``bias``, chunk by chunk,
    recomputing each chunk's logits (bit-identical to the forward's) into one reused ``[chunk, V]`` buffer."""
    n_tok = hidden.shape[0]
    grad_h = torch.empty_like(hidden) if need_h else None
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
    grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
    buf = hidden.new_empty(max(1, min(chunk_size, n_tok)), weight.shape[0], dtype=torch.float32)
    w = weight.to(cdt)
    b = bias.to(cdt) if bias is not None else None
    for s in range(0, n_tok, chunk_size):
        e = min(s + chunk_size, n_tok)
        h = hidden[s:e].to(cdt)
        g = _chunk_logits(h, w, b, temperature, buf)
        g.sub_(lse[s:e, None]).exp_()  # softmax
        g.mul_(-scale[s:e, None])
        g.scatter_add_(-1, labels[s:e, None], scale[s:e, None])  # (onehot - softmax) * g / T
        g = g.to(cdt)
        if need_h:
            grad_h[s:e] = g @ w
        if need_w:
            if cdt == torch.float32:
                grad_w.addmm_(g.t(), h)
            else:
                grad_w.add_(g.t() @ h)
        if need_b:
            grad_b.add_(g.sum(0))
    grad_w = grad_w.to(weight.dtype) if need_w else None
    grad_b = grad_b.to(bias.dtype) if need_b else None
    return grad_h, grad_w, grad_b


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, *,
                     temperature: float = 1.0, with_entropy: bool = False, chunk_size: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``labels`` ``[N]`` and entropy (detached; zeros unless ``with_entropy``) for
    ``hidden`` ``[N, H]`` under the head ``weight`` ``[V, H]``/``bias`` ``[V]`` -> two float32 ``[N]``.

    Peak extra memory is about ``chunk_size x V x 4`` bytes (``x 2`` with the entropy), whatever ``N``;
    ``chunk_size=None`` uses :func:`default_chunk_size`.
    """
    chunk_size = chunk_size or default_chunk_size(weight.shape[0])
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return ChunkedLogProbs.apply(hidden, weight, bias, labels, float(temperature), int(chunk_size),
                                 bool(with_entropy), _compute_dtype(hidden, weight))


def next_token_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` bool: position t is real and so is t+1 (its next token exists)."""
    am = attention_mask.bool()
    nxt = torch.zeros_like(am)
    nxt[:, :-1] = am[:, 1:]
    return am & nxt


def _full_logits_outputs(model, input_ids, attention_mask, use_pack: bool, max_pack_tokens) -> torch.Tensor:
    """``[N, V]`` logits of the real tokens from the whole model (heads the chunked path can't reproduce)."""
    if not use_pack:
        return pack(model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits, attention_mask)

    def fn(ids, pos, kwargs):
        return model(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False, **kwargs).logits

    return packed_apply(fn, input_ids, attention_mask, max_pack_tokens=max_pack_tokens,
                        varlen=is_varlen(model.base_model))


def forward_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float,
                     with_entropy: bool = False, chunk_size: int | None = None,
                     autocast_dtype: torch.dtype | None = None, packing: bool | None = None,
                     max_pack_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, S]`` next-token-aligned log-probabilities and entropies (float32) of a right-padded batch.

    ``packing``: None = pack when the model supports it (probed once), True/False = force on/off.
    ``max_pack_tokens``: tokens per pack (None = the ``train/packing.py`` default).
    ``chunk_size``: tokens per vocabulary-projection chunk (None = ``default_chunk_size(V)``).
    """
    ctx = torch.autocast(input_ids.device.type, autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    valid = next_token_mask(attention_mask)
    labels = torch.roll(input_ids, -1, dims=1)[valid]
    keep = valid[attention_mask.bool()]  # next-token positions among the real tokens (row-major)
    head = model.get_output_embeddings()
    special_head = getattr(model.config, "final_logit_softcapping", None) or getattr(model.config, "logit_scale", None)
    use_pack = use_packing(model.base_model, attention_mask, packing)
    with ctx:
        if special_head or not isinstance(head, torch.nn.Linear):
            logits = _full_logits_outputs(model, input_ids, attention_mask, use_pack, max_pack_tokens)
            logits = logits[keep].float() / temperature
            lse = torch.logsumexp(logits, -1)
            lp = logits.gather(-1, labels[:, None]).squeeze(-1) - lse
            ent = (lse - (torch.softmax(logits, -1) * logits).sum(-1)).detach() if with_entropy else torch.zeros_like(lp)
        else:
            hidden = real_token_hidden(model.base_model, input_ids, attention_mask, packing=use_pack,
                                       max_pack_tokens=max_pack_tokens)
            lp, ent = chunked_logprobs(hidden[keep], head.weight, head.bias, labels, temperature=temperature,
                                       with_entropy=with_entropy, chunk_size=chunk_size)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    entropy = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    return logp.masked_scatter(valid, lp.float()), entropy.masked_scatter(valid, ent.float())
