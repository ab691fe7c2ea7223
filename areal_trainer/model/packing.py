"""Sequence packing for the training forward: compute only the real tokens of a right-padded
micro-batch and hand the results back per real token.

A right-padded ``[B, S]`` micro-batch has ``N = attention_mask.sum()`` real tokens. Packing places
several sequences side by side in one row with ``position_ids`` restarting at 0 at every sequence
and calls the model with ``attention_mask=None``; transformers then keeps the sequences apart:

* **flash-attention** (GPU, ``attn_implementation`` containing ``flash``): all real tokens form
  one row ``[1, N]`` and the attention gets ``cu_seq_lens_q/k`` and ``max_length_q/k`` (so it
  does not re-derive them from ``position_ids`` in every layer): varlen attention per sequence, no
  padding, no mask, cost ``sum(L_i^2)``. No cap is needed (memory is linear in ``N``); with
  ``max_pack_tokens`` set, the rows of the grid below are laid end to end in one ``[1, P x C]`` row.
* **sdpa / eager / flex_attention**: ``create_causal_mask`` sees packed ``position_ids``
  (``find_packed_sequence_indices``) and builds a block-diagonal causal mask. That mask is
  *dense*: a pack row of ``C`` tokens costs ``C^2`` mask memory (bool for sdpa, float for eager)
  and ``C^2`` attention scores per head, of which only ``sum(L_i^2)/2`` are used. So the packs are
  rows of at most ``C = max_pack_tokens`` tokens (best-fit decreasing), run as one ``[P, C]``
  batch; a row that is not full ends in a throw-away filler block. The default ``C`` is 1.5x the
  micro-batch's longest row, at most 8192 (``DEFAULT_MAX_PACK_TOKENS``, a 64 MiB bool mask per
  row): rows fill to ~90-97%, so the linear layers (most of the FLOPs) see about ``N`` instead of
  ``B x S`` tokens, while the mask and attention work (``P x C^2``) stay about those of the padded
  batch (``B x S^2``). One pack of all ``N`` tokens would make attention ``O(N^2)``: on CPU with
  the 10M built-in model that is slower than no packing (``scripts/bench_packing.py --widths
  8192``). A sequence longer than ``C`` gets a row of its own (sequences are never split).

Results come back in *row-major real-token order*, the order of ``x[attention_mask.bool()]`` for a
padded ``[B, S, ...]`` tensor ``x``; :func:`unpack` scatters them back to ``[B, S, ...]``.

Whether a model packs correctly is decided per module (:func:`supports_packing`): its attention
implementation must be one that honours packed ``position_ids``, and a one-off probe (two short
sequences, packed versus one at a time, eval mode, no grad) must agree. Anything else, and any
batch that is not right-padded, falls back to the ordinary padded forward.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

DEFAULT_MAX_PACK_TOKENS = 8192
"""Upper bound of the default pack width for dense-mask attention (a ``C^2`` mask per pack row)."""
PACK_WIDTH_FACTOR = 1.5
"""Default dense-mask pack width, in multiples of the micro-batch's longest row."""

_PACKED_IMPLS = ("sdpa", "eager", "flex_attention")
_probe_results: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

PackedFn = Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]
"""``fn(input_ids [P, C], position_ids [P, C], attn_kwargs) -> [P, C, ...]`` for one forward."""


@dataclass(frozen=True)
class PackLayout:
    """Where the ``N`` real tokens of a right-padded ``[B, S]`` batch sit in a packed ``[P, C]`` grid.

    ``rows[p]``: batch rows in pack row ``p``, in placement order; ``lengths``: real tokens per batch
    row; ``index [N]``: flat grid slot of each real token, row-major over the batch;
    ``position_ids [P, C]``: 0.. restarting at every sequence and at the filler block that ends a
    row which is not full; ``blocks[p]``: the lengths of the sequences and filler block of row ``p``.
    """

    rows: list[list[int]]
    lengths: list[int]
    index: torch.Tensor
    position_ids: torch.Tensor
    blocks: list[list[int]]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.position_ids.shape)

    def pack(self, x: torch.Tensor, fill: int | float = 0) -> torch.Tensor:
        """Real tokens ``[N, ...]`` (row-major) -> grid ``[P, C, ...]`` with ``fill`` in filler slots."""
        out = x.new_full((self.position_ids.numel(), *x.shape[1:]), fill)
        return out.index_copy(0, self.index, x).view(*self.shape, *x.shape[1:])

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """Grid ``[P, C, ...]`` -> real tokens ``[N, ...]`` in row-major batch order (differentiable)."""
        return y.reshape(-1, *y.shape[2:]).index_select(0, self.index)


# ----------------------------------------------------------------------------- pure index helpers

def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Real tokens per row of a ``[B, S]`` mask."""
    return attention_mask.bool().sum(1).tolist()


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of ``[B, S]`` is ``1...1 0...0`` (what packing needs to be exact)."""
    am = attention_mask.bool()
    lengths = am.sum(1, keepdim=True)
    return bool((am == (torch.arange(am.shape[1], device=am.device)[None] < lengths)).all())


def plan_packs(lengths: Sequence[int], width: int | None) -> list[list[int]]:
    """Assign rows to packs of at most ``width`` tokens (best-fit decreasing; ``None`` = one pack).

    Rows of length 0 are skipped; a row longer than ``width`` gets a pack of its own. Returns the
    row indices of each pack, deterministic (ties keep row and pack order).
    """
    order = sorted((r for r, n in enumerate(lengths) if n > 0), key=lambda r: -lengths[r])
    if width is None:
        return [sorted(order)] if order else []
    packs: list[list[int]] = []
    loads: list[int] = []
    for r in order:
        fits = [p for p, load in enumerate(loads) if load + lengths[r] <= width]
        if fits:
            p = max(fits, key=lambda q: loads[q])  # the fullest pack it still fits in
            packs[p].append(r)
            loads[p] += lengths[r]
        else:
            packs.append([r])
            loads.append(lengths[r])
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


def pack_layout(lengths: Sequence[int], width: int | None, device: torch.device | None = None) -> PackLayout:
    """The :class:`PackLayout` of rows with ``lengths`` in pack rows of at most ``width`` tokens
    (None: one row). ``C`` is the fullest row's load (``<= width`` unless a single sequence is longer)."""
    rows = plan_packs(lengths, width)
    loads = [sum(lengths[r] for r in pack_rows) for pack_rows in rows] or [0]
    n_rows, width = len(loads), max(max(loads), 1)
    base = [0] * len(lengths)  # grid slot of each batch row's first token
    blocks = []
    for p, pack_rows in enumerate(rows):
        offset = p * width
        for r in pack_rows:
            base[r], offset = offset, offset + lengths[r]
        blocks.append([lengths[r] for r in pack_rows] + ([width - loads[p]] if loads[p] < width else []))
    blocks = blocks or [[width]]
    lens = torch.as_tensor(list(lengths), dtype=torch.long, device=device)
    pos_real = packed_position_ids(lengths, device)
    index = torch.repeat_interleave(torch.as_tensor(base, dtype=torch.long, device=device), lens,
                                    output_size=len(pos_real)) + pos_real
    # Filler slots count 0.. from where their row's sequences end: one block of their own.
    used = torch.as_tensor(loads, dtype=torch.long, device=device)
    filler_pos = (torch.arange(width, device=device)[None] - used[:, None]).clamp(min=0)
    position_ids = filler_pos.reshape(-1).index_copy(0, index, pos_real).view(n_rows, width)
    return PackLayout(rows=rows, lengths=list(lengths), index=index, position_ids=position_ids, blocks=blocks)


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


def default_pack_tokens(lengths: Sequence[int], varlen: bool) -> int | None:
    """Pack width when not configured: none for varlen attention (one row of all ``N`` tokens), else
    ``PACK_WIDTH_FACTOR`` x the longest row, at most ``DEFAULT_MAX_PACK_TOKENS`` (see the module docstring)."""
    if varlen:
        return None
    return min(DEFAULT_MAX_PACK_TOKENS, math.ceil(PACK_WIDTH_FACTOR * max(lengths, default=1)))


def packed_apply(fn: PackedFn, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 max_pack_tokens: int | None, varlen: bool = False,
                 row_kwargs: Callable[[list[int]], dict] | None = None) -> torch.Tensor:
    """Run ``fn`` once on the packed real tokens of a right-padded batch.

    ``input_ids``/``attention_mask`` ``[B, S]`` -> ``[N, ...]`` outputs in row-major real-token order.
    Pack rows hold at most ``max_pack_tokens`` tokens (None: :func:`default_pack_tokens`).
    Dense-mask attention gets the ``[P, C]`` grid; varlen attention gets the grid flattened to one
    row ``[1, P x C]`` plus ``cu_seq_lens_q/k`` and ``max_length_q/k`` of its blocks.
    ``row_kwargs(order)``: more keyword arguments of ``fn`` given the batch rows in the order the grid
    holds them (a VLM's images, ``model/vision.py``).
    """
    lengths = row_lengths(attention_mask)
    width = max_pack_tokens or default_pack_tokens(lengths, varlen)
    layout = pack_layout(lengths, width, input_ids.device)
    ids, pos = layout.pack(pack(input_ids, attention_mask)), layout.position_ids
    extra = row_kwargs([r for rows in layout.rows for r in rows]) if row_kwargs is not None else {}
    if not varlen:
        return layout.unpack(fn(ids, pos, extra))
    blocks = [n for row in layout.blocks for n in row]
    cu = cu_seq_lens(blocks, ids.device)
    kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(blocks), max_length_k=max(blocks), **extra)
    out = fn(ids.reshape(1, -1), pos.reshape(1, -1), kwargs)
    return layout.unpack(out.reshape(*layout.shape, *out.shape[2:]))


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
        return packed_apply(backbone_fn(backbone), input_ids, attention_mask, max_pack_tokens=max_pack_tokens,
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
    if backbone not in _probe_results:
        _probe_results[backbone] = _probe(backbone)
    return _probe_results[backbone]


def _probe(backbone: torch.nn.Module) -> bool:
    """Two short sequences packed into one row must match their separate forwards."""
    return agrees_with_row_by_row(backbone, [3, 2], lambda ids, am: packed_apply(
        backbone_fn(backbone), ids, am, max_pack_tokens=None, varlen=is_varlen(backbone)))


def agrees_with_row_by_row(backbone: torch.nn.Module, lengths: Sequence[int], forward: Callable,
                           shared_prefix: int = 0) -> bool:
    """Whether ``forward(ids, attention_mask) -> [N, H]`` on random rows of ``lengths`` (the first
    ``shared_prefix`` tokens the same in the first two) equals each row's own forward (eval mode, no
    grad, no autocast; relative 1e-3 in float32, 5e-2 otherwise). Any exception counts as no."""
    try:
        param = next(backbone.parameters())
        vocab = int(getattr(backbone.config, "vocab_size", 4) or 4)
        ids = torch.randint(0, vocab, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(0))
        ids[1, :shared_prefix] = ids[0, :shared_prefix]
        ids = ids.to(param.device)
        am = (torch.arange(max(lengths))[None] < torch.tensor(list(lengths))[:, None]).long().to(param.device)
        was_training = backbone.training
        backbone.eval()
        try:
            with torch.no_grad(), torch.autocast(param.device.type, enabled=False):
                got = forward(ids, am)
                want = torch.cat([backbone(input_ids=ids[i:i + 1, :n], use_cache=False).last_hidden_state[0]
                                  for i, n in enumerate(lengths)])
        finally:
            backbone.train(was_training)
    except Exception:  # any architecture that cannot take the packed/tree inputs falls back
        return False
    tol = 1e-3 if param.dtype == torch.float32 else 5e-2
    scale = want.float().abs().max().clamp(min=1.0)
    return got.shape == want.shape and bool((got.float() - want.float()).abs().max() / scale <= tol)
