"""Shared-prefix training: the prefix tree of a batch (hand-built example, round trip, the token
count), the tree-masked forward equal to the unshared one (log-probs, entropies, values and every
gradient) for the Llama-style built-in model and a Qwen2-style config on sdpa and eager attention,
with truncated rows, answers of 0-1 tokens, duplicate rows, groups of different sizes and
token-budget micro-batches; models that cannot take the mask fall back or fail clearly."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM

from areal_trainer.config.parts import MicroBatchSpec
from areal_trainer.errors import UserError
from areal_trainer.model import prefix
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.model.critic import ValueModel
from areal_trainer.train.models.logprobs import forward_logprobs
from areal_trainer.train.models.update import micro_batches

RTOL = 1e-5


def _grouped_batch(prompt_lens, answer_lens, vocab=60, seed=0):
    """Rows of consecutive groups: group g's rows share a prompt of ``prompt_lens[g]`` tokens, then
    answers of ``answer_lens[g][i]`` tokens; right-padded."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for p, answers in zip(prompt_lens, answer_lens):
        prompt = torch.randint(6, vocab, (p,), generator=g)
        rows += [torch.cat([prompt, torch.randint(6, vocab, (a,), generator=g)]) for a in answers]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], am[i, :len(r)] = r, 1
    return ids, am


# ----------------------------------------------------------------------------- the tree (pure)

def test_tree_of_a_hand_built_batch():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 0, 0], [7, 8, 9, 0]])
    am = (torch.arange(4) < torch.tensor([4, 4, 2, 3])[:, None]).long()
    tree = prefix.prefix_tree(ids, am)
    # 13 real tokens, 8 distinct prefixes: 1 2 3 4 | 5 (after 1 2 3) | 7 8 9
    assert tree.n_unique == 8 == prefix.count_tree_tokens(ids, am)
    assert tree.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0]]
    assert tree.position_ids.tolist() == [[0, 1, 2, 3, 3], [0, 1, 2, 0, 0]]
    assert tree.mask.int().tolist() == [
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]],  # 5 does not see 4
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]]  # fillers: self only
    assert tree.slot.tolist() == [0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 5, 6, 7]


@st.composite
def _batches(draw):
    n_groups = draw(st.integers(1, 4))
    prompts = [draw(st.integers(0, 6)) for _ in range(n_groups)]
    answers = [[draw(st.integers(0, 5)) for _ in range(draw(st.integers(1, 4)))] for _ in range(n_groups)]
    return _grouped_batch(prompts, answers, vocab=9, seed=draw(st.integers(0, 99)))


@settings(max_examples=60, deadline=None)
@given(_batches(), st.sampled_from([None, 0, 3, 7]))
def test_tree_reproduces_every_token_and_position(batch, cap):
    ids, am = batch
    tree = prefix.prefix_tree(ids, am, max_tree_tokens=cap or None)
    grid = tree.grid_index[tree.slot]
    assert tree.input_ids.reshape(-1)[grid].tolist() == ids[am.bool()].tolist()
    positions = torch.arange(ids.shape[1]).expand_as(ids)[am.bool()]
    assert tree.position_ids.reshape(-1)[grid].tolist() == positions.tolist()
    assert tree.n_unique == prefix.count_tree_tokens(ids, am, max_tree_tokens=cap or None)
    # Uncapped, the slots are exactly the distinct prefixes.
    distinct = {tuple(ids[r, :t + 1].tolist()) for r in range(len(ids)) for t in range(int(am[r].sum()))}
    assert prefix.count_tree_tokens(ids, am, max_tree_tokens=0) == len(distinct)
    # Every query slot sees itself, and only slots of its own row's path at earlier positions.
    flat = tree.mask.reshape(-1, tree.mask.shape[-1])
    cols = tree.grid_index % tree.mask.shape[-1]
    assert bool(flat[tree.grid_index, cols].all())


def test_group_prefix_costs_a_groups_prompt_once():
    ids, am = _grouped_batch([5, 3], [[2, 4, 0], [1, 1]])
    gp = prefix.group_prefix(ids, am, [3, 2])
    assert gp.group == [0, 0, 0, 1, 1]
    lengths = am.sum(1).tolist()  # [7, 9, 5, 4, 4]
    assert gp.cost([0, 1, 2], lengths) == 5 + 2 + 4 + 0 == prefix.count_tree_tokens(ids[:3], am[:3])
    assert gp.cost([1, 2], lengths) == 5 + 4 + 0
    assert gp.cost([3, 4], lengths) == 3 + 1 + 1


def test_token_budget_counts_unique_tokens_and_keeps_groups_together():
    ids, am = _grouped_batch([20, 20, 20], [[2, 2, 2, 2]] * 3)
    lengths = am.sum(1).tolist()  # 22 tokens a row, 28 unique tokens a group
    gp = prefix.group_prefix(ids, am, [4, 4, 4])
    spec = MicroBatchSpec(max_tokens_per_mb=60)
    shared = micro_batches(list(range(12)), lengths, spec, gp)
    assert len(shared) == 2 and all(len(m) % 4 == 0 and len({r // 4 for r in m}) == len(m) // 4 for m in shared)
    assert all(prefix.count_tree_tokens(ids[m], am[m]) <= 60 for m in shared)
    assert len(micro_batches(list(range(12)), lengths, spec)) == 6  # unshared: two 22-token rows per 60
    # A group larger than the budget is split; rows of a group that are not consecutive in the
    # micro-batch's row list are separate units.
    assert max(len(m) for m in micro_batches(list(range(4)), lengths, MicroBatchSpec(max_tokens_per_mb=25), gp)) == 2
    assert sorted(map(sorted, micro_batches([0, 1, 4, 5], lengths, MicroBatchSpec(n_mbs=2), gp))) == [[0, 1], [4, 5]]


# ----------------------------------------------------------------------------- exactness

def _qwen2(impl):
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    return Qwen2ForCausalLM._from_config(cfg, attn_implementation=impl)


def _builtin(impl):
    model = build_model("builtin:tiny", build_tokenizer(), seed=0)
    model.config._attn_implementation = impl
    return model


MODELS = {"builtin-sdpa": lambda: _builtin("sdpa"), "builtin-eager": lambda: _builtin("eager"),
          "qwen2-sdpa": lambda: _qwen2("sdpa"), "qwen2-eager": lambda: _qwen2("eager")}
# Groups of different sizes (as after the DAPO filter), a full-width (truncated) row, answers of 0 and
# 1 tokens, a prompt-only group, duplicate answers.
EDGES = dict(prompt_lens=[7, 4, 9, 1], answer_lens=[[3, 0, 1, 5], [6, 6], [12, 2, 1], [0, 3]])


def _relclose(a, b, name=""):
    a, b = a.detach(), b.detach()
    scale = b.abs().max().clamp(min=1e-6)
    assert float((a - b).abs().max() / scale) <= RTOL, (name, float((a - b).abs().max()), float(scale))


@pytest.mark.parametrize("name", list(MODELS))
def test_shared_logprobs_entropies_and_gradients_equal_the_unshared_forward(name):
    model = MODELS[name]()
    assert prefix.supports_tree(model.base_model)
    vocab = model.config.vocab_size
    ids, am = _grouped_batch(**EDGES, vocab=vocab)
    ids[3] = ids[2]  # two identical rows
    out = {}
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        logp, ent = forward_logprobs(model, ids, am, temperature=0.7, with_entropy=True, prefix_sharing=shared)
        w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
        w[:, ::3] = 0  # tokens outside the loss
        (w * logp).sum().backward()
        out[shared] = (logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()})
    _relclose(out[True][0], out[False][0], "logp")
    _relclose(out[True][1], out[False][1], "entropy")
    for n, g in out[False][2].items():
        _relclose(out[True][2][n], g, n)


def test_shared_critic_values_and_gradients_equal_the_unshared_forward():
    critic = ValueModel.from_causal_lm(_qwen2("sdpa"))
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)
    ids, am = _grouped_batch(**EDGES, vocab=64)
    out = {}
    for shared in (False, True):
        critic.zero_grad(set_to_none=True)
        values = critic(ids, am, prefix_sharing=shared)
        (values * torch.linspace(-1, 1, ids.shape[1])).sum().backward()
        out[shared] = (values.detach(), {n: p.grad.clone() for n, p in critic.named_parameters()})
    _relclose(out[True][0], out[False][0], "values")
    assert bool((out[True][0][am == 0] == 0).all())
    for n, g in out[False][1].items():
        _relclose(out[True][1][n], g, n)


def test_capped_trees_and_micro_batches_give_the_same_numbers():
    model = _builtin("sdpa")
    ids, am = _grouped_batch([10, 10, 10], [[3, 4, 2]] * 3, vocab=model.config.vocab_size)
    full, _ = forward_logprobs(model, ids, am, temperature=1.0)
    capped, _ = forward_logprobs(model, ids, am, temperature=1.0, prefix_sharing=True, max_pack_tokens=15)
    _relclose(capped, full)
    assert prefix.prefix_tree(ids, am, max_tree_tokens=15).n_unique > prefix.count_tree_tokens(ids, am)  # capped
    ids_mb, am_mb = ids[3:], am[3:]  # a micro-batch that starts inside nothing: its own trees
    part, _ = forward_logprobs(model, ids_mb, am_mb, temperature=1.0, prefix_sharing=True)
    _relclose(part, full[3:, :part.shape[1]])


# ----------------------------------------------------------------------------- fallback and errors

def test_unsupported_attention_falls_back_by_default_and_fails_when_asked_for():
    model = _builtin("sdpa")
    model.config._attn_implementation = "flash_attention_2"
    on, line = prefix.resolve_tree_training(model.base_model, None, "actor.enable_tree_training")
    assert not on and "actor.enable_tree_training: off" in line and "flash_attention_2" in line
    with pytest.raises(UserError, match=r"critic\.enable_tree_training=true.*'flash_attention_2'.*=false"):
        prefix.resolve_tree_training(model.base_model, True, "critic.enable_tree_training")
    assert prefix.resolve_tree_training(model.base_model, False, "actor.enable_tree_training") == (False, None)
    model.config._attn_implementation = "sdpa"
    assert prefix.resolve_tree_training(model.base_model, None, "actor.enable_tree_training") == (True, None)


def test_sliding_window_models_do_not_share():
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    model = Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa")
    assert "sliding-window" in prefix.tree_unsupported_reason(model.base_model)
