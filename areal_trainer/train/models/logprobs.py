"""Log-probabilities (and entropy) of the next token from a causal LM, next-token aligned:
position ``t`` holds ``log pi(x_{t+1} | x_<=t)``; the last real position and padding hold 0.

Two things keep the training forward lean:

* **Packing** (``model/packing.py``): the backbone runs only the micro-batch's real tokens, packed
  into rows with ``position_ids`` restarting at every sequence (varlen flash-attention on GPU, the
  block-diagonal causal mask of transformers on sdpa/eager), so no padding token is computed.
  Models that cannot pack fall back to the right-padded forward; outputs are the same ``[B, S]``.
* **Chunked head** (:class:`ChunkedLogProbs`): the vocabulary projection, log-softmax and entropy
  run on ``chunk_size`` tokens at a time (default: at most 1024 tokens and 256 MiB of float32
  logits per chunk), in one reused ``[chunk_size, V]`` buffer (a second one holds ``exp``); no
  ``[N, V]`` tensor ever exists. Saved for backward are the hidden states, the per-token
  log-partition, and the last chunk's logits, which stay in the buffer the backward works in.
  Backward starts from that chunk, recomputes the logits of the others, turns them into the
  softmax gradient in place, and accumulates the hidden and weight gradients chunk by chunk. The
  price is one extra ``[N, H] x [H, V]`` matmul over all chunks but the last (four instead of the
  three of a plain autograd forward/backward). Tokens whose upstream gradient is exactly 0
  (loss-masked prompt tokens, clipped PPO ratios: ``torch.where`` masking gives exact zeros) are
  left out of the recomputation, which wins that matmul back in a real policy loss.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ...model.packing import is_varlen, pack, packed_apply, real_token_hidden, use_packing
from ...model.prefix import prefix_tree, tree_hidden
from ...model.vision import has_images, vision_hidden, vision_logits

CHUNK_ELEMENTS = 1 << 26
"""Default chunk budget: ``chunk_size x V`` float32 logits of at most 256 MiB (441 tokens at V=152k)."""
CHUNK_TOKENS = 1024
"""Default upper bound on tokens per chunk (1024 at V=32k: 128 MiB). Larger chunks cut the number of
passes over the ``[V, H]`` weight gradient; beyond about a thousand tokens that gain is gone."""


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per head chunk for a vocabulary of ``vocab_size``: ``2^26 / V``, within [64, 1024]."""
    return max(64, min(CHUNK_TOKENS, CHUNK_ELEMENTS // max(vocab_size, 1)))


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
    the same distribution is returned detached. Saved for backward: ``hidden``, the ``[N]``
    log-partition and, when a gradient is needed, the last chunk's logits (in the buffer the
    backward works in anyway, so that chunk is not recomputed).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature: float, chunk_size: int, with_entropy: bool,
                compute_dtype: torch.dtype):
        n_tok, vocab = hidden.shape[0], weight.shape[0]
        keep_last = any(ctx.needs_input_grad[:3])
        logp = torch.empty(n_tok, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.zeros_like(logp)
        rows = max(1, min(chunk_size, n_tok))
        buf = hidden.new_empty(rows, vocab, dtype=torch.float32)
        # exp() goes to a second buffer when the entropy needs the logits afterwards, or when the
        # last chunk's logits are kept for backward; otherwise it overwrites them in place.
        buf_p = hidden.new_empty(rows, vocab, dtype=torch.float32) if with_entropy or keep_last else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute_dtype)
            b = bias.to(compute_dtype) if bias is not None else None
            for s in range(0, n_tok, chunk_size):
                e = min(s + chunk_size, n_tok)
                z = _chunk_logits(hidden[s:e].to(compute_dtype), w, b, temperature, buf)
                m = z.amax(-1, keepdim=True)
                z.sub_(m)  # shifted logits, <= 0
                target = z.gather(-1, labels[s:e, None]).squeeze(-1)
                if buf_p is not None:
                    p = torch.exp(z, out=buf_p[: e - s])
                    total = p.sum(-1)
                    if with_entropy:
                        # H = log Z - sum(exp(z) z) / Z  with shifted logits z and Z = sum exp(z)
                        entropy[s:e] = total.log() - p.mul_(z).sum(-1) / total
                else:
                    total = z.exp_().sum(-1)
                log_total = total.log()
                logp[s:e] = target - log_total
                lse[s:e] = m.squeeze(-1) + log_total
        del buf_p
        # The last chunk's shifted logits stay in `buf`, with the row where that chunk starts and
        # its log-partition relative to the shift.
        ctx.last_chunk = (buf, s, log_total) if keep_last and n_tok else None
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.temperature, ctx.chunk_size, ctx.compute_dtype = temperature, chunk_size, compute_dtype
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        last, ctx.last_chunk = ctx.last_chunk, None  # consumed: a second backward recomputes everything
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        cdt, temperature = ctx.compute_dtype, ctx.temperature
        # d logp_i / d raw_logits = (onehot(y_i) - softmax_i) / T, times the upstream g_i.
        scale = grad_logp.float() / temperature
        with torch.autocast(hidden.device.type, enabled=False):
            grads = _HeadGrads(hidden, weight, bias, cdt, need_h, need_w, need_b)
            buf, start = None, hidden.shape[0]
            if last is not None:
                buf, start, log_total = last
                g = buf[: hidden.shape[0] - start]
                g.sub_(log_total[:, None]).exp_()  # softmax of the kept chunk, no recomputation
                grads.add(g, hidden[start:], scale[start:], labels[start:], slice(start, None))
            # The other chunks, recomputed. Tokens with g_i == 0 (prompt and other loss-masked
            # tokens, clipped PPO ratios) contribute nothing: they are left out.
            sc = scale[:start]
            rows = None if bool((sc != 0).all()) else sc.nonzero().squeeze(-1)
            n = start if rows is None else rows.numel()
            if buf is None and n:
                buf = hidden.new_empty(max(1, min(ctx.chunk_size, n)), weight.shape[0], dtype=torch.float32)
            for s in range(0, n, ctx.chunk_size):
                sel = slice(s, min(s + ctx.chunk_size, n)) if rows is None else rows[s:s + ctx.chunk_size]
                h = hidden[sel]
                g = _chunk_logits(h.to(cdt), grads.w, grads.b, temperature, buf)
                g.sub_(lse[sel, None]).exp_()  # softmax
                grads.add(g, h, scale[sel], labels[sel], sel)
        return (*grads.result(), None, None, None, None, None)


class _HeadGrads:
    """Accumulates the head's gradients chunk by chunk from softmax chunks (in place, in the buffer)."""

    def __init__(self, hidden, weight, bias, cdt, need_h, need_w, need_b):
        self.weight, self.bias, self.cdt = weight, bias, cdt
        self.w = weight.to(cdt)
        self.b = bias.to(cdt) if bias is not None else None
        self.grad_h = torch.zeros_like(hidden) if need_h else None
        self.grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        self.grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None

    def add(self, p, h, scale, labels, rows):
        """``p [n, V]``: softmax of the tokens ``rows`` (a slice or an index tensor), whose hidden
        states are ``h [n, H]`` and upstream ``scale [n]`` (already divided by T); ``p`` is overwritten."""
        p.mul_(-scale[:, None])
        p.scatter_add_(-1, labels[:, None], scale[:, None])  # (onehot - softmax) * g / T
        g = p.to(self.cdt)
        if self.grad_h is not None:
            self.grad_h[rows] = (g @ self.w).to(self.grad_h.dtype)
        if self.grad_w is not None:
            h = h.to(self.cdt)
            if self.cdt == torch.float32:
                self.grad_w.addmm_(g.t(), h)
            else:
                self.grad_w.add_(g.t() @ h)
        if self.grad_b is not None:
            self.grad_b.add_(g.sum(0))

    def result(self):
        grad_w = self.grad_w.to(self.weight.dtype) if self.grad_w is not None else None
        grad_b = self.grad_b.to(self.bias.dtype) if self.grad_b is not None else None
        return self.grad_h, grad_w, grad_b


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
                     max_pack_tokens: int | None = None, prefix_sharing: bool = False, vision=None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, S]`` next-token-aligned log-probabilities and entropies (float32) of a right-padded batch.

    ``vision``: each row's images (``model/vision.py``; None: text rows) for an image-text-to-text model;
    rows with images are packed like text rows (their images in pack order), never prefix-shared.

    ``packing``: None = pack when the model supports it (probed once), True/False = force on/off.
    ``prefix_sharing``: compute rows' common prefixes once (``model/prefix.py``; the caller checks
    support); the head then runs once per distinct (prefix, next token) pair.
    ``max_pack_tokens``: tokens per pack, or per tree with sharing (None = the modules' defaults).
    ``chunk_size``: tokens per vocabulary-projection chunk (None = ``default_chunk_size(V)``).
    """
    ctx = torch.autocast(input_ids.device.type, autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    valid = next_token_mask(attention_mask)
    labels = torch.roll(input_ids, -1, dims=1)[valid]
    keep = valid[attention_mask.bool()]  # next-token positions among the real tokens (row-major)
    head = model.get_output_embeddings()
    special_head = getattr(model.config, "final_logit_softcapping", None) or getattr(model.config, "logit_scale", None)
    use_pack = use_packing(model.base_model, attention_mask, packing)
    images = has_images(vision)
    if images and prefix_sharing:
        raise ValueError("rows with images are not computed with shared prefixes (the caller turns sharing off)")
    with ctx:
        if special_head or not isinstance(head, torch.nn.Linear):
            logits = (vision_logits(model, input_ids, attention_mask, vision) if images else
                      _full_logits_outputs(model, input_ids, attention_mask, use_pack, max_pack_tokens))
            logits = logits[keep].float() / temperature
            lse = torch.logsumexp(logits, -1)
            lp = logits.gather(-1, labels[:, None]).squeeze(-1) - lse
            ent = ((lse - (torch.softmax(logits, -1) * logits).sum(-1)).detach() if with_entropy
                   else torch.zeros_like(lp))
        elif prefix_sharing:
            lp, ent = _shared_prefix_logprobs(model, head, input_ids, attention_mask, keep, labels,
                                              temperature=temperature, with_entropy=with_entropy,
                                              chunk_size=chunk_size, max_tree_tokens=max_pack_tokens)
        else:
            hidden = (vision_hidden(model.base_model, input_ids, attention_mask, vision, packing=use_pack,
                                    max_pack_tokens=max_pack_tokens) if images else
                      real_token_hidden(model.base_model, input_ids, attention_mask, packing=use_pack,
                                        max_pack_tokens=max_pack_tokens))
            lp, ent = chunked_logprobs(hidden[keep], head.weight, head.bias, labels, temperature=temperature,
                                       with_entropy=with_entropy, chunk_size=chunk_size)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    entropy = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    return logp.masked_scatter(valid, lp.float()), entropy.masked_scatter(valid, ent.float())


def _shared_prefix_logprobs(model, head, input_ids, attention_mask, keep, labels, *, temperature, with_entropy,
                            chunk_size, max_tree_tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs/entropies of the next-token positions ``keep`` (``[N]`` bool over real tokens) through
    the prefix tree: rows sharing a prefix share its slots, and a slot's head output is computed once
    per distinct next token (all rows through a slot agree on it, except where they branch)."""
    tree = prefix_tree(input_ids, attention_mask, max_tree_tokens=max_tree_tokens)
    hidden = tree_hidden(model.base_model, tree)  # [U, H]
    vocab = head.weight.shape[0]
    pairs, inverse = torch.unique(tree.slot[keep] * vocab + labels, return_inverse=True)
    lp, ent = chunked_logprobs(hidden[pairs // vocab], head.weight, head.bias, pairs % vocab,
                               temperature=temperature, with_entropy=with_entropy, chunk_size=chunk_size)
    return lp[inverse], ent[inverse]
