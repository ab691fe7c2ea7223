"""Straightforward per-step loop implementations of GAE, for equivalence tests and benchmarks only.

They follow the recurrences of :mod:`areal_trainer.advantage.gae` literally, one Python iteration
per position (or turn slot), and are far too slow for training.
"""

from __future__ import annotations

import torch


def _per_row(lam, n_rows, like):
    if isinstance(lam, torch.Tensor):
        return lam.to(like.dtype)
    return torch.full((n_rows,), float(lam), dtype=like.dtype, device=like.device)


def token_gae_loop(rewards, values, loss_mask, bootstrap, *, discount, gae_lambda):
    """Token GAE by a reverse loop over positions; ``(advantages, returns)``, 0 advantage when masked."""
    r, v = rewards.double(), values.double()
    m = loss_mask.bool()
    n_rows, seq_len = m.shape
    lam = _per_row(gae_lambda, n_rows, r)
    adv = torch.zeros_like(r)
    a_next = torch.zeros(n_rows, dtype=r.dtype)
    v_next = bootstrap.double().clone()
    for t in reversed(range(seq_len)):
        delta = r[:, t] + discount * v_next - v[:, t]
        cand = delta + discount * lam * a_next
        active = m[:, t]
        a_next = torch.where(active, cand, a_next)
        v_next = torch.where(active, v[:, t], v_next)
        adv[:, t] = torch.where(active, a_next, 0.0)
    return adv, torch.where(m, adv + v, v)


def turn_gae_loop(rewards, values, loss_mask, turn_ids, bootstrap, *, discount, gae_lambda):
    """Turn GAE by a reverse loop over turn slots ``0..S-1`` (a slot with no active token is skipped)."""
    r, v = rewards.double(), values.double()
    m = loss_mask.bool()
    ids = turn_ids.long()
    n_rows, seq_len = m.shape
    lam = _per_row(gae_lambda, n_rows, r)
    slot = torch.where(m, ids, torch.full_like(ids, seq_len))
    turn_r = torch.zeros(n_rows, seq_len + 1, dtype=r.dtype).scatter_add_(1, slot, r)[:, :seq_len]
    pos = torch.arange(seq_len).expand(n_rows, seq_len)
    first = torch.full((n_rows, seq_len + 1), seq_len, dtype=torch.long)
    first = first.scatter_reduce(1, slot, pos, reduce="amin")[:, :seq_len]
    valid = first < seq_len
    turn_v = torch.where(valid, v.gather(1, first.clamp(max=seq_len - 1)), 0.0)
    turn_a = torch.zeros_like(turn_r)
    a_next = torch.zeros(n_rows, dtype=r.dtype)
    v_next = bootstrap.double().clone()
    for u in reversed(range(seq_len)):
        delta = turn_r[:, u] + discount * v_next - turn_v[:, u]
        cand = delta + discount * lam * a_next
        ok = valid[:, u]
        a_next = torch.where(ok, cand, a_next)
        v_next = torch.where(ok, turn_v[:, u], v_next)
        turn_a[:, u] = torch.where(ok, cand, 0.0)
    at = ids.clamp(0, seq_len - 1)
    adv = torch.where(m, turn_a.gather(1, at), 0.0)
    returns = torch.where(m, (turn_a + turn_v).gather(1, at), v)
    return adv, returns


def legacy_token_gae(rewards, values, loss_mask, no_eos, *, discount, gae_lambda):
    """The original loop: bootstrap from the last column for no-EOS rows, last column never visited,
    masked positions inherit the next active advantage. Returns ``(advantages, returns)``."""
    r, v = rewards.double(), values.double()
    m = loss_mask.bool()
    n_rows, seq_len = m.shape
    adv = torch.zeros_like(r)
    a_next = torch.zeros(n_rows, dtype=r.dtype)
    v_next = v[:, -1] * no_eos.double()
    for t in range(seq_len - 2, -1, -1):
        delta = r[:, t] + discount * v_next - v[:, t]
        cand = delta + discount * gae_lambda * a_next
        a_next = torch.where(m[:, t], cand, a_next)
        v_next = torch.where(m[:, t], v[:, t], v_next)
        adv[:, t] = a_next
    return adv, adv + v
