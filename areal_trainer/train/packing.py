"""Sequence packing for the training forward: run only the real tokens of a right-padded
micro-batch, without padding, and hand results back per real token.

A right-padded ``[B, S]`` micro-batch has ``N = attention_mask.sum()`` real tokens. Packing
concatenates them into rows ``[1, T]`` ("packs") whose ``position_ids`` restart at 0 at every
sequence, and calls the model with ``attention_mask=None``:

* flash-attention implementations (GPU) get ``cu_seq_lens_q/k`` and ``max_length_q/k``, so
  attention runs varlen per sequence: no padding, no mask, cost ``sum(L_i^2)``;
* ``sdpa``/``eager``/``flex_attention`` get the block-diagonal causal mask that transformers'
  ``create_causal_mask`` builds from packed ``position_ids`` (``find_packed_sequence_indices``).
  That mask is dense: a pack of ``T`` tokens costs ``T^2`` mask memory (bool for sdpa, float for
  eager) and ``T^2`` attention scores, of which only ``sum(L_i^2)/2`` are used. Packs are
  therefore capped: a micro-batch is split into several packs of at most ``max_pack_tokens``
  tokens (default ``min(8192, 2 x longest row)``), which bounds the mask to ``8192^2`` bools
  (64 MiB) and keeps the wasted attention work at most about that of the padded batch, while every
  linear layer (most of the FLOPs) sees only real tokens.

Results come back in *row-major real-token order*, i.e. the order of ``x[attention_mask.bool()]``
for a padded ``[B, S, ...]`` tensor ``x``; :func:`unpack` scatters them back to ``[B, S, ...]``.

Whether a model packs correctly is decided per module (:func:`supports_packing`): its attention
implementation must be one that honours packed ``position_ids``, and a one-off probe (two short
sequences, packed versus one at a time, eval mode, no grad) must agree. Anything else falls back
to the ordinary right-padded forward.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

DEFAULT_MAX_PACK_TOKENS = 8192
"""Hard cap on tokens per pack for dense-mask attention (``T^2`` mask and scores)."""

_PACKED_IMPLS = ("sdpa", "eager", "flex_attention")
_probe_results: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

PackedFn = Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]
"""``fn(input_ids [1, T], position_ids [1, T], attn_kwargs) -> [1, T, ...]`` for one pack."""


# ----------------------------------------------------------------------------- pure index helpers

def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Real tokens per row of a ``[B, S]`` mask."""
    return attention_mask.bool().sum(1).tolist()


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of ``[B, S]`` is ``1...1 0...0`` (what packing needs to be exact)."""
    am = attention_mask.bool()
    lengths = am.sum(1, keepdim=True)
    return bool((am == (torch.arange(am.shape[1], device=am.device)[None] < lengths)).all())


def plan_packs(lengths: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Group rows, in order, into consecutive packs of at most ``max_tokens`` tokens (next fit).

    Rows of length 0 are skipped; a row longer than ``max_tokens`` gets a pack of its own (a sequence
    is never split). ``None`` puts every row in one pack. Returns row indices per pack.
    """
    packs: list[list[int]] = []
    current: list[int] = []
    size = 0
    for row, n in enumerate(lengths):
        if n <= 0:
            continue
        if current and max_tokens is not None and size + n > max_tokens:
            packs.append(current)
            current, size = [], 0
        current.append(row)
        size += n
    if current:
        packs.append(current)
    return packs


def packed_position_ids(lengths: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """``[sum(lengths)]`` positions ``0..L-1`` of each sequence, concatenated."""
    lens = torch.as_tensor(list(lengths), dtype=torch.long, device=device)
    total = int(lens.sum())
    starts = torch.cumsum(lens, 0) - lens
    return torch.arange(total, device=device) - torch.repeat_interleave(starts, lens, output_size=total)


def cu_seq_lens(lengths: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """``[len(lengths) + 1]`` int32 cumulative lengths ``[0, L0, L0+L1, ...]`` (flash varlen)."""
    lens = torch.as_tensor(list(lengths), dtype=torch.int32, device=device)
    return torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))


def pack(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, S, ...]`` -> ``[N, ...]`` real tokens in row-major order."""
    return x[attention_mask.bool()]


def unpack(values: torch.Tensor, attention_mask: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """``[N, ...]`` (row-major real-token order) -> ``[B, S, ...]`` with ``fill`` at padding.

    Differentiable with respect to ``values``; the inverse of :func:`pack` on real positions.
    """
    am = attention_mask.bool()
    out = values.new_full((am.numel(), *values.shape[1:]), fill)
    index = am.reshape(-1).nonzero().squeeze(-1)
    return out.index_copy(0, index, values).view(*am.shape, *values.shape[1:])


# ----------------------------------------------------------------------------- forwards

def attn_implementation(module: torch.nn.Module) -> str:
    config = getattr(module, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "")


def is_varlen(module: torch.nn.Module) -> bool:
    """Flash-attention implementations take ``cu_seq_lens`` and need no dense mask."""
    return "flash" in attn_implementation(module)


def default_max_pack_tokens(module: torch.nn.Module, lengths: Sequence[int]) -> int | None:
    """No cap for varlen attention; otherwise ``min(8192, 2 x longest row)`` (see module docstring)."""
    if is_varlen(module):
        return None
    return min(DEFAULT_MAX_PACK_TOKENS, 2 * max(lengths, default=1))


def packed_apply(fn: PackedFn, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 max_pack_tokens: int | None, varlen: bool = False) -> torch.Tensor:
    """Run ``fn`` pack by pack over the real tokens of a right-padded batch.

    ``input_ids``/``attention_mask`` ``[B, S]`` -> ``[N, ...]`` outputs in row-major real-token order.
    ``varlen`` adds flash-attention ``cu_seq_lens_q/k`` and ``max_length_q/k`` to ``attn_kwargs``.
    """
    lengths = row_lengths(attention_mask)
    ids = pack(input_ids, attention_mask)
    outs, start = [], 0
    for rows in plan_packs(lengths, max_pack_tokens):
        lens = [lengths[r] for r in rows]
        n = sum(lens)
        kwargs: dict = {}
        if varlen:
            cu = cu_seq_lens(lens, ids.device)
            kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lens), max_length_k=max(lens))
        pos = packed_position_ids(lens, ids.device)
        outs.append(fn(ids[start:start + n][None], pos[None], kwargs)[0])
        start += n
    if not outs:  # no real token at all
        return fn(input_ids[:1, :1], torch.zeros(1, 1, dtype=torch.long, device=ids.device), {})[0, :0]
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def backbone_fn(backbone: torch.nn.Module) -> PackedFn:
    """A :data:`PackedFn` returning a Hugging Face base model's ``last_hidden_state``."""
    def fn(ids: torch.Tensor, pos: torch.Tensor, kwargs: dict) -> torch.Tensor:
        return backbone(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False,
                        **kwargs).last_hidden_state
    return fn


def real_token_hidden(backbone: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                      packing: bool | None = None, max_pack_tokens: int | None = None) -> torch.Tensor:
    """``[N, H]`` last hidden states of the real tokens (row-major), packed when possible.

    ``packing``: None = auto (:func:`use_packing`), True = force, False = padded forward.
    """
    if use_packing(backbone, attention_mask, packing):
        cap = max_pack_tokens or default_max_pack_tokens(backbone, row_lengths(attention_mask))
        return packed_apply(backbone_fn(backbone), input_ids, attention_mask, max_pack_tokens=cap,
                            varlen=is_varlen(backbone))
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    return pack(hidden, attention_mask)


# ----------------------------------------------------------------------------- support detection

def use_packing(backbone: torch.nn.Module, attention_mask: torch.Tensor, packing: bool | None) -> bool:
    """Resolve the ``packing`` switch for one micro-batch (auto needs right padding and support)."""
    if packing is not None:
        return packing
    return is_right_padded(attention_mask) and supports_packing(backbone)


def supports_packing(backbone: torch.nn.Module) -> bool:
    """Whether ``backbone`` (a HF base model) computes packed rows exactly; probed once per module."""
    impl = attn_implementation(backbone)
    if not (impl in _PACKED_IMPLS or "flash" in impl):
        return False
    try:
        return _probe_results[backbone]
    except KeyError:
        pass
    ok = _probe(backbone)
    _probe_results[backbone] = ok
    return ok


def _probe(backbone: torch.nn.Module) -> bool:
    """Two short sequences packed into one row must match their separate forwards."""
    try:
        param = next(backbone.parameters())
        vocab = int(getattr(backbone.config, "vocab_size", 2) or 2)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (2, 3), generator=g).to(param.device)
        am = torch.tensor([[1, 1, 1], [1, 1, 0]], device=param.device)
        was_training = backbone.training
        backbone.eval()
        try:
            with torch.no_grad(), torch.autocast(param.device.type, enabled=False):
                packed = packed_apply(backbone_fn(backbone), ids, am, max_pack_tokens=None,
                                      varlen=is_varlen(backbone))
                single = torch.cat([backbone(input_ids=ids[i:i + 1, :n], use_cache=False).last_hidden_state[0]
                                    for i, n in enumerate((3, 2))])
        finally:
            backbone.train(was_training)
    except Exception:  # any architecture that cannot take packed position_ids falls back
        return False
    tol = 1e-3 if param.dtype == torch.float32 else 5e-2
    scale = single.float().abs().max().clamp(min=1.0)
    return packed.shape == single.shape and bool((packed.float() - single.float()).abs().max() / scale <= tol)
