"""Sequence packing and the chunked head: packed forwards equal padded ones (log-probabilities,
entropies, values and gradients), the pack layout round-trips, packs respect the token cap, the
block-diagonal mask is really built, and unsupported models fall back to the padded forward."""

from types import SimpleNamespace

import pytest
import torch
from transformers.models.llama import modeling_llama

from areal_trainer.model import packing
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.model.critic import ValueModel
from areal_trainer.train.models.logprobs import chunked_logprobs, forward_logprobs

ATOL = 1e-5


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _model(tok):
    return build_model("builtin:tiny", tok, seed=0)


def _batch(tok, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    am = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(6, len(tok), (len(lengths), width), generator=g) * am
    return ids, am


def _logp_and_grads(model, ids, am, **kw):
    model.zero_grad(set_to_none=True)
    logp, ent = forward_logprobs(model, ids, am, temperature=0.7, with_entropy=True, **kw)
    g = torch.Generator().manual_seed(1)
    weights = torch.randn(ids.shape, generator=g)
    weights[:, ::3] = 0  # some tokens outside the loss: their rows are skipped in backward
    (weights * logp).sum().div(am.sum()).backward()
    return logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(a[1], b[1], atol=ATOL, rtol=0)
    for name, grad in a[2].items():
        torch.testing.assert_close(grad, b[2][name], atol=ATOL, rtol=0, msg=name)


# ----------------------------------------------------------------------------- layout (pure)

@pytest.mark.parametrize("lengths,width", [([5, 1, 2, 9, 7], 9), ([3, 0, 4], None), ([1], 4), ([2, 2, 2, 2], 3),
                                           ([40, 3, 17, 1, 2, 25], 30)])
def test_layout_round_trip_and_positions(lengths, width):
    layout = packing.pack_layout(lengths, width)
    n = sum(lengths)
    x = torch.arange(n, dtype=torch.float32)[:, None] * torch.tensor([1.0, -1.0])
    grid = layout.pack(x, fill=-7)
    assert grid.shape[:2] == layout.shape
    torch.testing.assert_close(layout.unpack(grid), x)
    # every slot is a real token or filler, never both; real positions restart at 0 per sequence
    assert int((grid[..., 0] != -7).sum()) == n
    expected = torch.cat([torch.arange(L) for L in lengths if L]) if n else torch.zeros(0, dtype=torch.long)
    torch.testing.assert_close(layout.position_ids.reshape(-1)[layout.index], expected)
    # blocks describe each row exactly (sequences then filler) and every row is within the cap
    for p, blocks in enumerate(layout.blocks):
        assert sum(blocks) == layout.shape[1]
        starts = torch.tensor([0] + blocks[:-1]).cumsum(0)
        assert (layout.position_ids[p, starts] == 0).all()
    if width is not None:
        assert layout.shape[1] <= max(width, max(lengths))


def test_plan_packs_respects_cap_and_keeps_every_row():
    lengths = [7, 0, 3, 12, 5, 5, 1, 9, 2]
    packs = packing.plan_packs(lengths, 10)
    rows = sorted(r for p in packs for r in p)
    assert rows == [r for r, n in enumerate(lengths) if n > 0]
    for p in packs:
        assert sum(lengths[r] for r in p) <= 10 or len(p) == 1  # the 12-token row alone
    assert [3] in packs
    assert packing.plan_packs(lengths, None) == [rows]
    assert len(packing.plan_packs([4] * 6, 8)) == 3


def test_pack_unpack_real_tokens():
    am = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    x = torch.randn(3, 4, 2)
    out = packing.unpack(packing.pack(x, am), am)
    torch.testing.assert_close(out, x * am[..., None])
    assert packing.is_right_padded(am) and not packing.is_right_padded(torch.tensor([[0, 1, 1]]))


def test_packed_position_ids_and_cu_seq_lens():
    assert packing.packed_position_ids([3, 1, 2]).tolist() == [0, 1, 2, 0, 0, 1]
    assert packing.cu_seq_lens([3, 1, 2]).tolist() == [0, 3, 4, 6]


# ----------------------------------------------------------------------------- packed == padded

@pytest.mark.parametrize("lengths", [[5, 1, 2, 12, 7, 2], [1, 2], [9], [2, 1, 1, 3]])
def test_packed_logprobs_entropy_and_grads_equal_padded(tok, lengths):
    model = _model(tok)
    ids, am = _batch(tok, lengths)
    padded = _logp_and_grads(model, ids, am, packing=False, chunk_size=5)
    for width in (8, 64):  # several packs / one pack
        _assert_same(_logp_and_grads(model, ids, am, packing=True, max_pack_tokens=width, chunk_size=3), padded)
    _assert_same(_logp_and_grads(model, ids, am), padded)  # auto: packs (the tiny Llama supports it)


def test_chunked_head_equals_full_softmax_with_bias_and_grads():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(23, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True)
    y = torch.randint(0, 50, (23,), generator=g)
    coef = torch.randn(23, generator=g)
    coef[::4] = 0
    ref_logits = torch.log_softmax((h @ w.T + b) / 0.6, -1)
    ref = ref_logits.gather(-1, y[:, None]).squeeze(-1)
    ref_ent = -(ref_logits.exp() * ref_logits).sum(-1)
    ref_grads = torch.autograd.grad((coef * ref).mean(), (h, w, b))
    for chunk in (1, 4, 100, None):
        lp, ent = chunked_logprobs(h, w, b, y, temperature=0.6, with_entropy=True, chunk_size=chunk)
        grads = torch.autograd.grad((coef * lp).mean(), (h, w, b))
        torch.testing.assert_close(lp, ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(ent, ref_ent.detach(), atol=ATOL, rtol=0)
        assert not ent.requires_grad
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    lp, ent = chunked_logprobs(h.detach(), w.detach(), None, y, temperature=1.0)
    assert (ent == 0).all() and lp.shape == (23,)


@pytest.mark.parametrize("chunk", [4, 23, 7])  # several chunks, one chunk, a short last chunk
def test_chunked_head_backward_twice_with_retained_graph(chunk):
    """The first backward consumes the kept last chunk in place; a second one recomputes it."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(23, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 50, (23,), generator=g)
    coef = torch.randn(23, generator=g)
    coef[-3:] = 0  # zero upstream gradients inside the kept chunk too
    ref = torch.log_softmax(h @ w.T / 0.9, -1).gather(-1, y[:, None]).squeeze(-1)
    ref_grads = torch.autograd.grad((coef * ref).sum(), (h, w))
    lp, _ = chunked_logprobs(h, w, None, y, temperature=0.9, with_entropy=True, chunk_size=chunk)
    loss = (coef * lp).sum()
    first = torch.autograd.grad(loss, (h, w), retain_graph=True)
    second = torch.autograd.grad(loss, (h, w))
    for a, b, want in zip(first, second, ref_grads):
        torch.testing.assert_close(a, want, atol=ATOL, rtol=0)
        torch.testing.assert_close(b, want, atol=ATOL, rtol=0)


def test_chunked_head_without_grad_keeps_no_logits():
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(9, 8, generator=g), torch.randn(30, 8, generator=g)
    y = torch.randint(0, 30, (9,), generator=g)
    lp, _ = chunked_logprobs(h, w, None, y, chunk_size=4)
    assert lp.grad_fn is None
    lp, _ = chunked_logprobs(h.requires_grad_(), w, None, y, chunk_size=4)
    assert lp.grad_fn is not None and lp.grad_fn.last_chunk[0].shape == (4, 30)


def test_chunked_head_under_autocast_matches_autocast_linear():
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(12, 32, generator=g), torch.randn(40, 32, generator=g) * 0.2
    y = torch.randint(0, 40, (12,), generator=g)
    with torch.autocast("cpu", torch.bfloat16):
        ref = torch.log_softmax(torch.nn.functional.linear(h, w).float(), -1).gather(-1, y[:, None]).squeeze(-1)
        lp, _ = chunked_logprobs(h, w, None, y, chunk_size=5)
    torch.testing.assert_close(lp, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("lengths", [[5, 1, 2, 12, 7], [1], [2, 9]])
def test_packed_values_and_grads_equal_padded(tok, lengths):
    critic = ValueModel.from_causal_lm(_model(tok))
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)
    ids, am = _batch(tok, lengths)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    out = {}
    for mode in (False, True, None):
        critic.zero_grad(set_to_none=True)
        values = critic(ids, am, packing=mode, max_pack_tokens=8 if mode else None)
        (weights * values).sum().div(am.sum()).backward()
        out[mode] = (values.detach(), {n: p.grad.clone() for n, p in critic.named_parameters()})
        assert (values[am == 0] == 0).all()
    for mode in (True, None):
        torch.testing.assert_close(out[mode][0], out[False][0], atol=ATOL, rtol=0)
        for name, grad in out[False][1].items():
            torch.testing.assert_close(out[mode][1][name], grad, atol=ATOL, rtol=0, msg=name)


# ----------------------------------------------------------------------------- the mask is real

def test_sdpa_gets_the_block_diagonal_causal_mask(tok, monkeypatch):
    model = _model(tok)
    assert model.config._attn_implementation == "sdpa"
    masks = []
    original = modeling_llama.create_causal_mask

    def spy(*args, **kwargs):
        mask = original(*args, **kwargs)
        masks.append(mask)
        return mask

    monkeypatch.setattr(modeling_llama, "create_causal_mask", spy)
    ids, am = _batch(tok, [3, 2, 1])
    packing.real_token_hidden(model.model, ids, am, packing=True, max_pack_tokens=6)
    (mask,) = masks
    seq = torch.tensor([0, 0, 0, 1, 1, 2])
    pos = torch.tensor([0, 1, 2, 0, 1, 0])
    expected = (seq[:, None] == seq[None]) & (pos[:, None] >= pos[None])
    assert mask.dtype == torch.bool and mask.shape == (1, 1, 6, 6)
    assert torch.equal(mask[0, 0], expected)


def test_positions_without_restart_would_mix_sequences(tok):
    """Negative control: the same packed row with plain 0..T-1 positions differs from the padded forward."""
    model = _model(tok)
    ids, am = _batch(tok, [4, 3])
    hidden = packing.real_token_hidden(model.model, ids, am, packing=False)
    row = packing.pack(ids, am)[None]
    plain = model.model(input_ids=row, use_cache=False).last_hidden_state[0]
    assert (plain[4:] - hidden[4:]).abs().max() > 1e-3
    torch.testing.assert_close(plain[:4], hidden[:4], atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- fallback

class _Mixer(torch.nn.Module):
    """A 'backbone' that accepts position_ids but mixes every token of a row (ignores packing)."""

    def __init__(self, impl="sdpa"):
        super().__init__()
        self.config = SimpleNamespace(_attn_implementation=impl, vocab_size=11)
        self.embed = torch.nn.Embedding(11, 4)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None, **kwargs):
        h = self.embed(input_ids)
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        return SimpleNamespace(last_hidden_state=h.cumsum(1))


class _NoPositions(_Mixer):
    def forward(self, input_ids, attention_mask=None, use_cache=None):
        return SimpleNamespace(last_hidden_state=self.embed(input_ids))


def test_support_detection_probes_and_falls_back():
    assert not packing.supports_packing(_Mixer())  # probe: packed != separate
    assert not packing.supports_packing(_NoPositions())  # probe: forward rejects position_ids
    assert not packing.supports_packing(_Mixer(impl="some_custom_kernel"))  # not a known implementation
    mixer = _Mixer()
    ids = torch.tensor([[1, 2, 3], [4, 5, 0]])
    am = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert not packing.use_packing(mixer, am, None)
    torch.testing.assert_close(packing.real_token_hidden(mixer, ids, am),
                               packing.real_token_hidden(mixer, ids, am, packing=False))


def test_forward_logprobs_falls_back_to_padded(tok, monkeypatch):
    model = _model(tok)
    ids, am = _batch(tok, [5, 2, 7])
    calls = []
    monkeypatch.setattr(packing, "packed_apply", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(packing, "supports_packing", lambda backbone: False)
    lp, _ = forward_logprobs(model, ids, am, temperature=1.0)
    assert calls == [] and lp.shape == ids.shape
    monkeypatch.undo()
    lp2, _ = forward_logprobs(model, ids, am, temperature=1.0, packing=False)
    torch.testing.assert_close(lp, lp2, atol=0, rtol=0)


def test_not_right_padded_batch_is_not_packed(tok):
    model = _model(tok)
    am = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert packing.supports_packing(model.model)
    assert not packing.use_packing(model.model, am, None)
    assert packing.use_packing(model.model, am, True)
