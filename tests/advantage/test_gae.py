"""GAE kernels: the worked examples of the reference (turn and token units, per-row lambda, the
legacy recurrence), equivalence with the per-step loops, and the ``turn_ids`` contract."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_trainer.advantage.gae import _compact_token_gae, token_level_gae, turn_level_gae
from areal_trainer.advantage.scan import MIN_STEP_COEF, reverse_discounted_cumsum, stepwise_discounted_cumsum
from areal_trainer.advantage.turns import check_turn_ids

from .helpers import T, close
from .reference import legacy_token_gae, token_gae_loop, turn_gae_loop

ONES4 = torch.ones(1, 4, dtype=torch.bool)


def test_turn_gae_two_turns():
    # R_1 = 0 + 2 = 2 -> A_1 = 2; R_0 = 0 + 1 = 1 -> A_0 = 1 + 1 * 0.5 * 2 = 2. V = 0 so returns = advantages.
    adv, ret = turn_level_gae(T([[0.0, 1, 0, 2]]), torch.zeros(1, 4), ONES4, T([[0, 0, 1, 1]]), torch.zeros(1),
                              discount=1.0, gae_lambda=0.5)
    close(adv, [[2, 2, 2, 2]])
    close(ret, [[2, 2, 2, 2]])


def test_turn_gae_truncated_with_gap_and_values():
    # Bootstrap 8 (row truncated). Turn 2: V_2 = V[3] = 2, delta = 4 + .5 * 8 - 2 = 6 -> A_2 = 6.
    # Turn 0: V_0 = V[0] = 1, delta = 3 + .5 * 2 - 1 = 3 -> A_0 = 3 + (.5 * .25) * 6 = 3.75.
    # Returns: A_u + V_u on the turn's tokens, the value itself (9) at the masked position.
    adv, ret = turn_level_gae(T([[0.0, 3, 0, 0, 4]]), T([[1.0, 5, 9, 2, 8]]), T([[1, 1, 0, 1, 1]]).bool(),
                              T([[0, 0, -1, 2, 2]]), T([8.0]), discount=0.5, gae_lambda=0.25)
    close(adv, [[3.75, 3.75, 0, 6, 6]])
    close(ret, [[4.75, 4.75, 9, 8, 8]])


def test_turn_gae_per_row_lambda():
    # Row 0 as in test_turn_gae_two_turns; row 1 with lambda 0: A_1 = 2, A_0 = R_0 = 1.
    r = T([[0.0, 1, 0, 2]]).repeat(2, 1)
    adv, _ = turn_level_gae(r, torch.zeros(2, 4), ONES4.repeat(2, 1), T([[0, 0, 1, 1]]).repeat(2, 1),
                            torch.zeros(2), discount=1.0, gae_lambda=T([0.5, 0.0]))
    close(adv, [[2, 2, 2, 2], [1, 1, 2, 2]])


def test_token_gae_per_row_lambda():
    # Reward 1 at position 2, gamma 1: lambda .5 gives .5**2, .5, 1; lambda 0 keeps only the reward's own step.
    m = T([[1, 1, 1, 0]]).bool().repeat(2, 1)
    adv, _ = token_level_gae(T([[0.0, 0, 1, 0]]).repeat(2, 1), torch.zeros(2, 4), m, torch.zeros(2),
                             discount=1.0, gae_lambda=T([0.5, 0.0]))
    close(adv, [[0.25, 0.5, 1, 0], [0, 0, 1, 0]])


def test_token_gae_matches_legacy_recurrence():
    # Legacy loop, gamma .9, lambda .8 (c = .72); it never visits the last column and bootstraps from
    # V[:, -1] for no-EOS rows, so the kernel gets that column masked and bootstrap V[:, -1] * no_eos.
    # Row 0 (EOS, bootstrap 0): t=1 delta = .5 - .2 = .3, A = .3; t=0 delta = .9 * .2 - .1 = .08,
    # A = .08 + .72 * .3 = .296.
    # Row 1 (no EOS, bootstrap .5): t=2 delta = .9 * .5 - 0 = .45; t=1 delta = 1 + 0 - .1 = .9,
    # A = .9 + .72 * .45 = 1.224.
    r = T([[0.0, 0.5, 0, 2], [0, 1, 0, 0]])
    v = T([[0.1, 0.2, 0.3, 0.4], [0.2, 0.1, 0, 0.5]])
    m = T([[1, 1, 0, 1], [0, 1, 1, 1]]).bool()
    no_eos = T([False, True])
    legacy_adv, legacy_ret = legacy_token_gae(r, v, m, no_eos, discount=0.9, gae_lambda=0.8)
    visited = m.clone()
    visited[:, -1] = False
    adv, ret = token_level_gae(r, v, visited, v[:, -1] * no_eos, discount=0.9, gae_lambda=0.8)
    close(adv, [[0.296, 0.3, 0, 0], [0, 1.224, 0.45, 0]], atol=1e-6)
    assert torch.allclose(adv[visited].double(), legacy_adv[visited], atol=1e-6)
    assert torch.allclose(ret[visited].double(), legacy_ret[visited], atol=1e-6)
    assert torch.allclose(ret[visited], (adv + v)[visited])


@pytest.mark.parametrize("discount,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.5), (1.0, "row")])
def test_kernels_match_loops(discount, lam):
    g = torch.Generator().manual_seed(7)
    n_rows, width = 6, 150
    m = torch.rand(n_rows, width, generator=g) < 0.6
    m[0] = False  # a row with no step at all
    r, v, boot = (torch.randn(n_rows, width, generator=g), torch.randn(n_rows, width, generator=g),
                  torch.randn(n_rows, generator=g))
    lam = torch.rand(n_rows, generator=g) if lam == "row" else lam
    ids = torch.where(m, ((torch.rand(n_rows, width, generator=g) < 0.05).long().cumsum(-1)) * 3, -1)
    fast = token_level_gae(r, v, m, boot, discount=discount, gae_lambda=lam)
    slow = token_gae_loop(r, v, m, boot, discount=discount, gae_lambda=lam)
    for a, b in zip(fast, slow):
        assert torch.allclose(a.double(), b, atol=1e-4)
    fast = turn_level_gae(r, v, m, ids, boot, discount=discount, gae_lambda=lam)
    slow = turn_gae_loop(r, v, m, ids, boot, discount=discount, gae_lambda=lam)
    for a, b in zip(fast, slow):
        assert torch.allclose(a.double(), b, atol=1e-4)


@pytest.mark.parametrize("discount,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (1.0, "row")])
def test_turn_kernel_takes_one_reward_per_row_as_the_outcome_at_the_last_active_token(discount, lam):
    # The [B] form credits each row's reward to its last turn, as the placed [B, S] outcome does; gaps in the
    # ids, a row without a turn, one turn only and a row whose last active token is its last column.
    g = torch.Generator().manual_seed(5)
    n_rows, width = 5, 120
    m = torch.rand(n_rows, width, generator=g) < 0.5
    m[0] = False
    m[1] = False
    m[1, 40:60] = True
    m[2, -1] = True
    ids = torch.where(m, ((torch.rand(n_rows, width, generator=g) < 0.06).long().cumsum(-1)) * 2, -1)
    ids[1] = torch.where(m[1], 7, -1)
    scores, v, boot = torch.randn(n_rows, generator=g), torch.randn(n_rows, width, generator=g), torch.randn(n_rows)
    lam = torch.rand(n_rows, generator=g) if lam == "row" else lam
    last = (m * torch.arange(1, width + 1)).amax(-1)  # 1-based, 0 without an active token
    placed = torch.zeros(n_rows, width).scatter_(1, (last - 1).clamp(min=0)[:, None], (scores * (last > 0))[:, None])
    per_row = turn_level_gae(scores, v, m, ids, boot, discount=discount, gae_lambda=lam)
    per_token = turn_level_gae(placed, v, m, ids, boot, discount=discount, gae_lambda=lam)
    slow = turn_gae_loop(placed, v, m, ids, boot, discount=discount, gae_lambda=lam)
    for a, b, c in zip(per_row, per_token, slow):
        assert torch.allclose(a, b, atol=1e-6)
        assert torch.allclose(a.double(), c, atol=1e-5)
    assert (per_row[0][0] == 0).all() and torch.equal(per_row[1][0], v[0])  # no turn: advantage 0, returns V


@pytest.mark.parametrize("n", [1, 63, 64, 65, 200, 4500])
def test_scan_matches_definition(n):
    x = torch.randn(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    coef = T([0.0, 0.7, 1.0], dtype=torch.float64)
    y = reverse_discounted_cumsum(x, coef)
    expected = torch.zeros_like(x)
    acc = torch.zeros(3, dtype=torch.float64)
    for i in reversed(range(n)):
        acc = x[:, i] + coef * acc
        expected[:, i] = acc
    assert torch.allclose(y, expected, atol=1e-9)


def _stepwise_definition(x, steps, coef, terminal):
    """``y_i = x_i + coef**steps_{i+1} * y_{i+1}``, ``y_N = terminal``: the discount is paid on entering a step."""
    x, steps = x.double(), steps.double()
    y = torch.zeros_like(x)
    acc = terminal.double()
    for i in reversed(range(x.shape[1])):
        acc = x[:, i] + acc * (coef ** steps[:, i + 1] if i + 1 < x.shape[1] else 1.0)
        y[:, i] = acc
    return y


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), coef=st.floats(MIN_STEP_COEF, 1.0), density=st.floats(0, 1),
       seed=st.integers(0, 10_000))
def test_stepwise_scan_matches_definition(n, coef, density, seed):
    # Chunk edges (n around multiples of 16), empty and full step masks, every coefficient it takes.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, n, generator=g)
    steps = (torch.rand(3, n, generator=g) < density).float()
    terminal = torch.randn(3, generator=g)
    y = stepwise_discounted_cumsum(x, steps, coef, terminal)
    assert torch.allclose(y.double(), _stepwise_definition(x, steps, coef, terminal), rtol=1e-5, atol=1e-5)


def test_stepwise_scan_long_rows_and_its_range():
    # 6000 positions: 375 chunks, so the recurrence over chunks takes nine doubling passes.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6000, generator=g)
    steps = (torch.rand(2, 6000, generator=g) < 0.5).float()
    for coef in (0.95, 1.0):
        y = stepwise_discounted_cumsum(x, steps, coef, T([1.0, -2.0]))
        assert torch.allclose(y.double(), _stepwise_definition(x, steps, coef, T([1.0, -2.0])), atol=1e-4)
    empty = stepwise_discounted_cumsum(torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.bool), 0.5, T([1.0, 2.0]))
    assert empty.shape == (2, 0)
    with pytest.raises(ValueError, match=r"coef must be in \[0.1, 1\]"):
        stepwise_discounted_cumsum(x, steps, 0.05, T([0.0, 0.0]))


@pytest.mark.parametrize("discount,lam", [(1.0, 1.0), (1.0, 0.5), (0.2, 0.5), (0.99, 0.95), (0.5, 1.0)])
def test_in_place_token_kernel_equals_the_compacting_one(discount, lam):
    # The settings the in-place kernel takes (lambda >= 0.5, gamma * lambda >= 0.1), at its edges, on long rows
    # with tool gaps, against the kernel that compacts the steps first and against the loop.
    g = torch.Generator().manual_seed(11)
    m = (torch.rand(4, 3000, generator=g) < 0.6).float()
    m[0] = 0  # a row with no step
    m[1, 2000:] = 0  # a row that ends early
    r, v, boot = torch.randn(4, 3000, generator=g), torch.randn(4, 3000, generator=g), torch.randn(4, generator=g)
    fast = token_level_gae(r, v, m, boot, discount=discount, gae_lambda=lam)
    compact = _compact_token_gae(r, v, m, boot, discount, lam)
    slow = token_gae_loop(r, v, m.bool(), boot, discount=discount, gae_lambda=lam)
    for a, c, b in zip(fast, compact, slow):
        assert torch.allclose(a, c, atol=2e-5)
        assert torch.allclose(a.double(), b, atol=1e-4)
    assert (fast[0][m == 0] == 0).all()


@pytest.mark.parametrize("ids,message", [
    ([-1, 0, 0, 1], "non-negative"),
    ([0, 0, 4, 4], "smaller than the sequence length"),
    ([0, 1, 0, 2], "temporally nondecreasing"),
])
def test_turn_ids_value_errors(ids, message):
    with pytest.raises(RuntimeError, match=message):
        check_turn_ids(T([ids]), ONES4)


def test_turn_ids_format_errors():
    with pytest.raises(ValueError, match="integer dtype"):
        check_turn_ids(T([[0.0, 0, 1, 1]]), ONES4)
    with pytest.raises(ValueError, match="must have shape"):
        check_turn_ids(T([[0, 0, 1]]), ONES4)
    with pytest.raises(ValueError, match="device"):
        check_turn_ids(torch.zeros(1, 4, dtype=torch.long, device="meta"), ONES4)
    check_turn_ids(T([[0, 0, 1, 1]], dtype=torch.uint8), ONES4)  # any integer dtype is accepted
    check_turn_ids(T([[0, -1, 3, 3]]), T([[1, 0, 1, 1]]).bool())  # -1 only where inactive; gaps allowed


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
@pytest.mark.parametrize("per_row", [False, True])
def test_turn_kernel_on_empty_batches(shape, per_row):
    n_rows, width = shape
    v = torch.randn(shape)
    r = torch.ones(n_rows) if per_row else torch.ones(shape)
    adv, ret = turn_level_gae(r, v, torch.ones(shape), torch.zeros(shape, dtype=torch.long), torch.zeros(n_rows),
                              discount=0.9, gae_lambda=0.9)
    assert adv.shape == ret.shape == shape and torch.equal(ret, v)


def test_turn_kernel_reads_its_columns_alike_through_the_flat_index_and_the_gather(monkeypatch):
    # Batches whose flat index would not be exact in float32 (B * (ids + 1) >= 2**24) read through gather.
    from areal_trainer.advantage import gae

    g = torch.Generator().manual_seed(3)
    m = torch.rand(4, 200, generator=g) < 0.6
    ids = torch.where(m, (torch.rand(4, 200, generator=g) < 0.05).long().cumsum(-1), -1)
    r, v, boot = torch.randn(4, 200, generator=g), torch.randn(4, 200, generator=g), torch.randn(4, generator=g)
    flat = turn_level_gae(r, v, m, ids, boot, discount=0.99, gae_lambda=0.95)
    monkeypatch.setattr(gae, "FLAT_LIMIT", 1)
    gathered = turn_level_gae(r, v, m, ids, boot, discount=0.99, gae_lambda=0.95)
    for a, b in zip(flat, gathered):
        assert torch.equal(a, b)
