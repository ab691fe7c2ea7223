"""``MultiTurnWorkflow`` as an agent on the episode session (``rollout/agents/multi_turn.py``) against the
workflow it replaced (``tests/rollout/frozen_multi_turn.py``, the old code unchanged): on the built-in tiny
model with the same seed, several rollout calls in a row, every engine call, every row tensor, reward,
metric and source value is identical."""

from __future__ import annotations

import copy

import pytest
import torch

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.model.chat import prompt_ids
from areal_trainer.rollout.agents.multi_turn import MultiTurnWorkflow
from areal_trainer.rollout.engines.hf import HFEngine
from tests.groups import reward_service
from tests.rollout.frozen_multi_turn import MultiTurnWorkflow as FrozenWorkflow

CPU = torch.device("cpu")
QUESTIONS = [("Tom has 3 apples. Tom buys 4 more. How many apples does Tom have now?", 7),
             ("Anna had 9 coins and lost 2 of them. How many coins are left?", 7),
             ("Ben has 5 pens. Ben buys 5 more. How many pens does Ben have now?", 10)]


def _samples() -> list[dict]:
    return [{"messages": [{"role": "user", "content": q}], "prompt": q, "answer": f"#### {a}", "fields": {}}
            for q, a in QUESTIONS]


class Recording:
    """An engine that keeps the prompts of every call it answered."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.max_positions = engine.max_positions

    def generate(self, prompts, gconfig):
        self.calls.append([list(p) for p in prompts])
        return self.engine.generate(prompts, gconfig)


def _chatml_eos():
    """The built-in tokenizer with EOS as the end-of-turn token (as Qwen's ``<|im_end|>``)."""
    tok = build_tokenizer()
    tok.eos_token = "<|im_end|>"
    return tok


def _stopping(model, tok, boost: float = 4.0):
    """``model`` with its EOS logit raised by ``boost``, so that the untrained model ends some answers itself
    (with the stop token the next turn's segment may start with) instead of running to ``max_new_tokens``."""
    def hook(module, args, out):
        out[..., tok.eos_token_id] += boost
        return out

    model.get_output_embeddings().register_forward_hook(hook)
    return model


def _run(cls, tok, model, reward_fn: str, rounds: int, gconfig, **kwargs):
    torch.manual_seed(1234)
    engine = Recording(HFEngine(model, tok, device=CPU))
    wf = cls(engine=engine, tokenizer=tok, reward=reward_service(reward_fn, max_error_fraction=1.0), **kwargs)
    try:
        return [wf.rollout(_samples(), gconfig) for _ in range(rounds)], engine.calls
    finally:
        getattr(wf, "close", lambda: None)()


def _assert_same_groups(old, new) -> None:
    assert len(old) == len(new)
    for a, b in zip(old, new):
        ta, tb = a.rows.as_dict(), b.rows.as_dict()
        assert sorted(ta) == sorted(tb)
        for key in ta:
            assert ta[key].dtype == tb[key].dtype and ta[key].shape == tb[key].shape, key
            assert torch.equal(ta[key], tb[key]), key
        assert a.stats == b.stats
        assert a.source_values == b.source_values
        assert a.episode_rows == b.episode_rows is None and a.episode_rewards == b.episode_rewards


@pytest.mark.parametrize("case", [
    dict(tokenizer="builtin", reward="tests.plugins.length_thirds_reward", max_turns=3, turn_discount=0.9,
         gconfig=dict(n_samples=4, max_new_tokens=8)),
    dict(tokenizer="chatml-eos", reward="tests.plugins.length_thirds_reward", max_turns=3, turn_discount=0.7,
         gconfig=dict(n_samples=3, max_new_tokens=6)),
    dict(tokenizer="builtin", reward="areal_trainer.reward.math.gsm8k_reward_fn", max_turns=2, turn_discount=0.9,
         gconfig=dict(n_samples=4, max_new_tokens=12)),
], ids=["builtin-3turns", "chatml-eos-3turns", "builtin-gsm8k-2turns"])
def test_the_agent_rows_are_the_old_workflows_bit_for_bit(case):
    tok = build_tokenizer() if case["tokenizer"] == "builtin" else _chatml_eos()
    model = _stopping(build_model("builtin:tiny", build_tokenizer(), seed=0), tok)
    gconfig = GenerationHyperparameters(**case["gconfig"])
    kwargs = dict(max_turns=case["max_turns"], turn_discount=case["turn_discount"])
    old, old_calls = _run(FrozenWorkflow, tok, copy.deepcopy(model), case["reward"], 3, gconfig, **kwargs)
    new, new_calls = _run(MultiTurnWorkflow, tok, copy.deepcopy(model), case["reward"], 3, gconfig, **kwargs)
    assert new_calls == old_calls  # the same engine calls: the same prompts, batched and ordered alike
    for a, b in zip(old, new):
        _assert_same_groups(a, b)
    # The comparison saw multi-turn episodes and (but for the untrained gsm8k) one-turn ones; answers that stop
    # and answers cut at max_new_tokens.
    turns = torch.cat([g["num_turns"] for groups in old for g in groups])
    assert turns.max() > 1 and (turns.min() == 1 or "gsm8k" in case["reward"])
    ends = torch.cat([g["input_ids"][torch.arange(g.n_rows), g["attention_mask"].sum(1) - 1]
                      for groups in old for g in groups])
    assert bool((ends == tok.eos_token_id).any()) and bool((ends != tok.eos_token_id).any())


@pytest.mark.parametrize("room", [5, 60], ids=["first-answers-capped", "later-turns-need-room"])
def test_the_row_limit_ends_episodes_alike(room):
    """``gconfig.max_tokens`` ``room`` tokens above the longest prompt: with 5 the first answers of the longest
    prompts are cut at the limit (below ``max_new_tokens``); with 60 a second turn fits and a fourth does not,
    so episodes end for want of room (the limit's two rules, ``rollout/limits.py``)."""
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    longest = max(len(prompt_ids(tok, s["messages"])) for s in _samples())
    gconfig = GenerationHyperparameters(n_samples=4, max_new_tokens=10, max_tokens=longest + room)
    kwargs = dict(max_turns=4, turn_discount=0.8)
    reward = "tests.plugins.length_thirds_reward"
    old, old_calls = _run(FrozenWorkflow, tok, copy.deepcopy(model), reward, 2, gconfig, **kwargs)
    new, new_calls = _run(MultiTurnWorkflow, tok, copy.deepcopy(model), reward, 2, gconfig, **kwargs)
    assert new_calls == old_calls
    for a, b in zip(old, new):
        _assert_same_groups(a, b)
    groups = [g for groups in old for g in groups]
    assert all(int(g["attention_mask"].sum(1).max()) <= longest + room for g in groups)
    if room == 5:  # the longest prompt's answers have 5 tokens, cut at the limit
        assert any(5.0 in g["loss_mask"].sum(1).tolist() for g in groups)
    else:  # a wrong answer (reward 0) that is not the last allowed one ended its episode: no room for another
        assert any(bool(((g["rewards"] == 0) & (g["num_turns"] < 4)).any()) for g in groups)
