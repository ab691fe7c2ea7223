"""Shared-prefix ("tree") training forward: rows that begin with the same tokens are computed once.

The answers of one prompt share the prompt; multi-turn episodes share their system prompt and first
turns. A right-padded ``[B, S]`` micro-batch is turned into a **prefix tree**: rows are sorted
lexicographically, each row shares its longest common prefix with its sorted predecessor (which is
the longest prefix it shares with any row), and only its remaining tokens become new *slots*. Every
slot is one token computed once, at position id = its depth; a row is the path of slots of its
tokens. ``U`` (slots) is the number of unique token prefixes, ``N`` (real tokens) what the unshared
forward computes.

The slots of each tree (rows linked by a shared prefix) are contiguous; trees are packed into rows
of a ``[P, C]`` grid like the unshared packing (``model/packing.py``) and run under a custom 4-D
attention mask in which a slot sees exactly the slots on its own path up to itself. Because a
token's hidden state depends only on the tokens before it, each slot's state equals that of every
row through it in the unshared forward; the rows' states are gathered from the slots, so in the
backward the gradients of all rows through a slot accumulate in it (autograd of the gather).

A tree holds at most ``max_tree_tokens`` slots (default: 4x the longest row, at most 8192): the
dense mask of a pack row costs ``C^2``, so a batch whose rows all share a system prompt becomes
several trees, each sharing the prompt, rather than one tree of all tokens.

Which models take the mask is decided once per module (:func:`supports_tree`): attention ``sdpa`` or
``eager`` (flash-attention takes no dense mask; sliding-window layers would ignore the window), and
a probe (a small tree versus the rows one at a time) must agree.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import UserError
from .packing import (
    DEFAULT_MAX_PACK_TOKENS,
    agrees_with_row_by_row,
    attn_implementation,
    pack_layout,
    row_lengths,
)

TREE_IMPLS = ("sdpa", "eager")
TREE_WIDTH_FACTOR = 4
"""Default slots per tree, in multiples of the micro-batch's longest row (at most DEFAULT_MAX_PACK_TOKENS)."""
_probe_results: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class PrefixTree:
    """The prefix tree of a right-padded ``[B, S]`` batch laid out in a ``[P, C]`` grid.

    ``slot [N]``: slot of each real token (row-major, the order of ``x[attention_mask.bool()]``);
    ``grid_index [U]``: flat grid position of each slot; ``input_ids``/``position_ids [P, C]``: the
    grid (filler: token 0, position 0); ``mask [P, C, C]`` bool: query slot sees key slot (filler
    slots see themselves only, so no attention row is empty).
    """

    slot: torch.Tensor
    grid_index: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor

    @property
    def n_unique(self) -> int:
        return int(self.grid_index.numel())

    def gather(self, grid_out: torch.Tensor) -> torch.Tensor:
        """Grid outputs ``[P, C, ...]`` -> per-slot outputs ``[U, ...]`` (differentiable)."""
        return grid_out.reshape(-1, *grid_out.shape[2:]).index_select(0, self.grid_index)


def sorted_order(input_ids: torch.Tensor, lengths: Sequence[int]) -> list[int]:
    """Non-empty rows in lexicographic order of their real tokens (ties: row order)."""
    rows = [r for r, n in enumerate(lengths) if n > 0]
    tokens = input_ids.tolist()
    return sorted(rows, key=lambda r: tokens[r][: lengths[r]])


def common_prefix(a: torch.Tensor, b: torch.Tensor, len_a: torch.Tensor, len_b: torch.Tensor) -> torch.Tensor:
    """``[R]`` length of the common prefix of rows ``a``/``b`` ``[R, S]`` with real lengths ``len_a``/``len_b``."""
    pos = torch.arange(a.shape[1], device=a.device)
    same = (a == b) & (pos[None] < torch.minimum(len_a, len_b)[:, None])
    return same.long().cumprod(1).sum(1)


def default_tree_tokens(lengths: Sequence[int]) -> int:
    return min(DEFAULT_MAX_PACK_TOKENS, math.ceil(TREE_WIDTH_FACTOR * max(lengths, default=1)))


def _plan(input_ids: torch.Tensor, lengths: Sequence[int], cap: int) -> tuple[list[int], list[int], list[int]]:
    """Sorted non-empty rows, the tokens each reuses from its sorted predecessor's slots, and the slot
    count of each tree (a row starts a new tree when it shares nothing or its tree would exceed ``cap``)."""
    ids = input_ids.cpu()
    order = sorted_order(ids, lengths)
    shared = [0] * len(order)
    if len(order) > 1:
        o = torch.as_tensor(order)
        lens = torch.as_tensor(lengths, dtype=torch.long)
        shared[1:] = common_prefix(ids[o[1:]], ids[o[:-1]], lens[o[1:]], lens[o[:-1]]).tolist()
    trees: list[int] = []
    for k, r in enumerate(order):  # rows, not positions
        if shared[k] == 0 or trees[-1] + lengths[r] - shared[k] > cap:
            shared[k] = 0
            trees.append(0)
        trees[-1] += lengths[r] - shared[k]
    return order, shared, trees


def prefix_tree(input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                max_tree_tokens: int | None = None) -> PrefixTree:
    """The :class:`PrefixTree` of a right-padded batch ``input_ids``/``attention_mask`` ``[B, S]``."""
    device, (n_rows_in, width) = input_ids.device, input_ids.shape
    lengths = row_lengths(attention_mask)
    order, shared, trees = _plan(input_ids, lengths, max_tree_tokens or default_tree_tokens(lengths))
    # Slots are numbered in sorted order, so each tree's slots are contiguous and a row's reused slots
    # (its predecessor's first tokens) are numbered before its new ones.
    slot_of = torch.full((n_rows_in, width), -1, dtype=torch.long)
    next_slot = 0
    for k, r in enumerate(order):
        share, n = shared[k], lengths[r]
        if share:
            slot_of[r, :share] = slot_of[order[k - 1], :share]
        slot_of[r, share:n] = torch.arange(next_slot, next_slot + n - share)
        next_slot += n - share
    layout = pack_layout(trees, max(trees, default=1))
    n_rows, c = layout.shape
    grid_index = layout.index  # grid position of each slot (tree by tree, as the packing places them)
    ids_cpu = input_ids.cpu()
    ids_u = torch.zeros(next_slot, dtype=torch.long)
    pos_u = torch.zeros(next_slot, dtype=torch.long)
    mask = torch.zeros(n_rows * c, c, dtype=torch.bool)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    for k, r in enumerate(order):  # each row writes the mask rows of the slots it creates
        share, n = shared[k], lengths[r]
        if n == share:
            continue
        path = grid_index[slot_of[r, :n]]
        ids_u[slot_of[r, share:n]] = ids_cpu[r, share:n]
        pos_u[slot_of[r, share:n]] = torch.arange(share, n)
        mask[path[share:, None], (path % c)[None, :]] = causal[share:n, :n]
    filler = torch.ones(n_rows * c, dtype=torch.bool)
    filler[grid_index] = False
    idx = filler.nonzero().squeeze(-1)
    mask[idx, idx % c] = True
    grid_ids = torch.zeros(n_rows * c, dtype=torch.long).index_copy(0, grid_index, ids_u)
    grid_pos = torch.zeros(n_rows * c, dtype=torch.long).index_copy(0, grid_index, pos_u)
    slot = slot_of[attention_mask.bool().cpu()]
    return PrefixTree(slot=slot.to(device), grid_index=grid_index.to(device),
                      input_ids=grid_ids.view(n_rows, c).to(device), position_ids=grid_pos.view(n_rows, c).to(device),
                      mask=mask.view(n_rows, c, c).to(device))


def count_tree_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                      max_tree_tokens: int | None = None) -> int:
    """Slots of the batch's prefix tree, what the shared forward computes, without building it
    (``max_tree_tokens=0``: no cap, i.e. the number of distinct token prefixes)."""
    lengths = row_lengths(attention_mask)
    cap = sum(lengths) if max_tree_tokens == 0 else (max_tree_tokens or default_tree_tokens(lengths))
    return sum(_plan(input_ids, lengths, cap)[2])


def attention_mask_4d(tree: PrefixTree, dtype: torch.dtype, impl: str) -> torch.Tensor:
    """``[P, 1, C, C]``: bool for sdpa, additive float (0 / dtype min) for eager attention."""
    m = tree.mask[:, None]
    if impl == "sdpa":
        return m
    return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, torch.finfo(dtype).min)


def tree_hidden(backbone: torch.nn.Module, tree: PrefixTree) -> torch.Tensor:
    """``[U, H]`` last hidden states of the slots of ``tree`` from a Hugging Face base model."""
    dtype = next(backbone.parameters()).dtype
    if torch.is_autocast_enabled(tree.input_ids.device.type):
        dtype = torch.get_autocast_dtype(tree.input_ids.device.type)
    mask = attention_mask_4d(tree, dtype, attn_implementation(backbone))
    out = backbone(input_ids=tree.input_ids, position_ids=tree.position_ids, attention_mask=mask,
                   use_cache=False).last_hidden_state
    return tree.gather(out)


# ----------------------------------------------------------------------------- support detection

VLM_REASON = ("it is an image-text-to-text model, whose rows are computed in full (packed) with their images: "
              "shared prefixes do not carry images")


def tree_unsupported_reason(backbone: torch.nn.Module) -> str | None:
    """Why ``backbone`` cannot run a tree mask (None: it can, probed once per module)."""
    if getattr(getattr(backbone, "config", None), "vision_config", None) is not None:
        return VLM_REASON
    impl = attn_implementation(backbone)
    if impl not in TREE_IMPLS:
        return f"its attention implementation is {impl or 'unknown'!r} (the tree mask needs 'sdpa' or 'eager')"
    config = getattr(backbone, "config", None)
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "use_sliding_window", False) or any("sliding" in str(t) for t in layer_types):
        return "it has sliding-window attention layers (a custom mask would ignore the window)"
    if backbone not in _probe_results:
        _probe_results[backbone] = _probe(backbone)
    return None if _probe_results[backbone] else "its tree-masked forward does not match the row-by-row forward"


def resolve_tree_training(backbone: torch.nn.Module, requested: bool | None, key: str) -> tuple[bool, str | None]:
    """Whether a model trains with shared prefixes, from its ``enable_tree_training`` setting ``requested``
    (None: where supported). Returns (on, a line to print when the default falls back); an explicit
    request on a model that cannot take the tree mask is an error naming ``key``."""
    if requested is False:
        return False, None
    reason = tree_unsupported_reason(backbone)
    if reason is None:
        return True, None
    if requested and reason == VLM_REASON:
        raise UserError(f"{key}=true, but {reason}. Set {key}=false or leave it unset.")
    if requested:
        raise UserError(f"{key}=true, but this model cannot compute shared prefixes: {reason}. Load it with "
                        f"attn_implementation='sdpa', or set {key}=false (or leave it unset: shared where supported).")
    return False, f"{key}: off ({reason}); training computes every row in full."


def supports_tree(backbone: torch.nn.Module) -> bool:
    return tree_unsupported_reason(backbone) is None


def _probe(backbone: torch.nn.Module) -> bool:
    """Three rows, two sharing a prefix, as a tree must match their one-at-a-time forwards."""
    def forward(ids, am):
        tree = prefix_tree(ids, am)
        return tree_hidden(backbone, tree)[tree.slot]

    return agrees_with_row_by_row(backbone, [5, 4, 2], forward, shared_prefix=3)


# ----------------------------------------------------------------------------- batching

@dataclass(frozen=True)
class GroupPrefix:
    """The prompt group of each row of a batch and the tokens it shares with its group's first row.

    Splitting a batch into minibatches and micro-batches keeps a group's rows together (so its
    prefix is computed once) and counts a group's shared tokens once against a token budget.
    """

    group: list[int]
    shared: list[int]

    def cost(self, rows: Sequence[int], lengths: Sequence[int]) -> int:
        """Tokens the shared forward computes for ``rows`` of one group (its prefix once)."""
        return max(self.shared[r] for r in rows) + sum(lengths[r] - self.shared[r] for r in rows)


def group_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, group_sizes: Sequence[int]) -> GroupPrefix:
    """:class:`GroupPrefix` of a batch whose groups are consecutive rows of ``group_sizes``."""
    offsets = [0]
    for n in group_sizes:
        offsets.append(offsets[-1] + n)
    group = [g for g, n in enumerate(group_sizes) for _ in range(n)]
    first = torch.as_tensor([offsets[g] for g in group], dtype=torch.long)
    lens = attention_mask.bool().sum(1).cpu()
    ids = input_ids.cpu()
    shared = common_prefix(ids, ids[first], lens, lens[first]).tolist()
    # A group's first row "shares" the longest prefix any other row shares with it, so that the cost of
    # any subset of the group is its largest shared prefix once plus each row's own tokens.
    for start, end in zip(offsets[:-1], offsets[1:]):
        if end > start:
            shared[start] = max(shared[start + 1:end], default=0)
    return GroupPrefix(group=group, shared=shared)
