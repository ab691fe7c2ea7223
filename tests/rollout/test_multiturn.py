"""MultiTurnWorkflow (the try-again agent on the episode session): scripted episodes checked token by token
against the turn_ids contract."""

from __future__ import annotations

import pytest
import torch

from areal_trainer.advantage import AdvantageInputs, TrajBatchMeta
from areal_trainer.components import load
from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.rollout.agents.multi_turn import DEFAULT_FEEDBACK, MultiTurnWorkflow
from areal_trainer.rollout.agents.template import joined, segment_text
from areal_trainer.rollout.engines.hf import Generation
from areal_trainer.rollout.rows import concat_rows
from areal_trainer.rollout.workflows.single_turn import prompt_ids
from tests.groups import reward_service

QUESTION = "Tom has 3 apples. Tom buys 4 more. How many apples does Tom have now?"
SAMPLE = {"messages": [{"role": "user", "content": QUESTION}], "answer": "3 + 4 = 7\n#### 7"}
WRONG, RIGHT = "3 - 4 = 1\n#### 1", "3 + 4 = 7\n#### 7"
VERSION = 3


class ScriptedEngine:
    """Call ``k`` answers its ``j``-th prompt with ``script[k][j]`` (or ``script[k]`` for all), then the
    stop token unless call ``k`` is listed in ``truncated``. Logprob of token ``i`` of call ``k``:
    ``-(k + 0.01 * (i + 1))``, so each value tells where it came from; its policy version is
    ``VERSION + k`` (as if the weights were updated between calls)."""

    def __init__(self, tokenizer, script, truncated=()):
        self.tokenizer, self.script, self.truncated = tokenizer, script, set(truncated)
        self.version = VERSION
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts, gconfig):
        k = len(self.calls)
        self.calls.append([list(p) for p in prompts])
        out = []
        for j in range(len(prompts)):
            text = self.script[k] if isinstance(self.script[k], str) else self.script[k][j]
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
            cut = k in self.truncated
            ids = ids if cut else ids + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [-(k + 0.01 * (i + 1)) for i in range(len(ids))], truncated=cut,
                                  versions=[self.version + k] * len(ids)))
        return out


def reward_runner():
    return reward_service(max_error_fraction=1.0)


def gcfg(n=1, **kw):
    return GenerationHyperparameters(n_samples=n, max_new_tokens=16, **kw)


def ids_of(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def feedback_ids(tok) -> list[int]:
    """The template's tokens after an answer to SAMPLE: the end of its turn, the feedback, the next opening."""
    return ids_of(tok, segment_text(tok, SAMPLE["messages"], [{"role": "user", "content": DEFAULT_FEEDBACK}], []))


def check_contract(group: dict) -> None:
    """The workflow side of the turn_ids contract, on a ``[G, L]`` group."""
    ids, mask, turns = group["input_ids"], group["loss_mask"], group["turn_ids"]
    assert turns.shape == ids.shape == mask.shape
    assert not turns.dtype.is_floating_point and turns.dtype.is_signed
    active = mask == 1
    assert bool((turns[~active] == -1).all()), "prompt, feedback and padding must be -1"
    seq = ids.shape[1]
    for r in range(ids.shape[0]):
        a = turns[r][active[r]]
        assert bool(((a >= 0) & (a < seq)).all())
        assert bool((a[1:] >= a[:-1]).all()), "active ids must be non-decreasing"
        # One id per assistant turn: every maximal run of loss_mask=1 carries one id, runs differ.
        edges = torch.diff(active[r].int(), prepend=torch.zeros(1, dtype=torch.int32))
        starts = torch.nonzero(edges == 1).flatten()
        assert len(starts) == int(group["num_turns"][r]) == len(torch.unique(a))
        assert bool((a[torch.searchsorted(torch.nonzero(active[r]).flatten(), starts)] == torch.unique(a)).all())


def test_two_turn_episode_token_by_token(tok):
    engine = ScriptedEngine(tok, [WRONG, RIGHT])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=3, turn_discount=0.9)
    (group,) = wf.rollout([SAMPLE], gcfg())
    prompt = prompt_ids(tok, SAMPLE["messages"])
    out0, out1 = ids_of(tok, WRONG) + [tok.eos_token_id], ids_of(tok, RIGHT) + [tok.eos_token_id]
    feedback = ids_of(tok, f"<|im_end|>\n<|im_start|>user\n{DEFAULT_FEEDBACK}<|im_end|>\n<|im_start|>assistant\n")
    expected = prompt + out0 + feedback + out1
    assert group["input_ids"][0].tolist() == expected
    n_p, n0, n_f, n1 = len(prompt), len(out0), len(feedback), len(out1)
    assert group["loss_mask"][0].tolist() == [0.0] * n_p + [1.0] * n0 + [0.0] * n_f + [1.0] * n1
    assert group["turn_ids"][0].tolist() == [-1] * n_p + [0] * n0 + [-1] * n_f + [1] * n1
    assert group["turn_ids"].dtype == torch.int32
    logp = group["logprobs"][0]
    assert torch.allclose(logp[n_p:n_p + n0], -(0 + 0.01 * torch.arange(1, n0 + 1)))
    assert torch.allclose(logp[n_p + n0 + n_f:], -(1 + 0.01 * torch.arange(1, n1 + 1)))
    assert bool((logp[group["loss_mask"][0] == 0] == 0).all())
    # Versions come from the engine per token: this one reports a weight update between the two calls.
    assert group["versions"][0].tolist() == [-1] * n_p + [VERSION] * n0 + [-1] * n_f + [VERSION + 1] * n1
    assert group["attention_mask"][0].tolist() == [1] * len(expected)
    assert group["rewards"].tolist() == [pytest.approx(0.9)]
    assert group["num_turns"].tolist() == [2.0] and group["num_turns"].dtype.is_floating_point
    assert group["is_truncated"].tolist() == [False]
    assert [len(c) for c in engine.calls] == [1, 1] and engine.calls[1][0] == prompt + out0 + feedback
    check_contract(group)
    # Without the model's stop tokens the row is the template's rendering of the whole conversation.
    conversation = [*SAMPLE["messages"], {"role": "assistant", "content": WRONG},
                    {"role": "user", "content": DEFAULT_FEEDBACK}]
    rendered = ids_of(tok, tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False))
    assert [t for t in expected if t != tok.eos_token_id] == rendered + ids_of(tok, RIGHT)


def test_chatml_eos_is_not_duplicated(tok):
    """When EOS is the template's end-of-turn token the row equals the template rendering exactly."""
    chatml = build_tokenizer()
    chatml.eos_token = "<|im_end|>"
    engine = ScriptedEngine(chatml, [WRONG, RIGHT])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=chatml, reward=reward_runner())
    (group,) = wf.rollout([SAMPLE], gcfg())
    conversation = [*SAMPLE["messages"], {"role": "assistant", "content": WRONG},
                    {"role": "user", "content": DEFAULT_FEEDBACK}, {"role": "assistant", "content": RIGHT}]
    rendered = chatml.apply_chat_template(conversation, tokenize=False)
    full = ids_of(chatml, rendered)
    assert group["input_ids"][0].tolist() == full[:-1]  # the template's final "\n" follows the last answer
    row = group["input_ids"][0]
    assert int((row == chatml.eos_token_id).sum()) == 4  # user, answer, feedback, answer: one each
    end_positions = torch.nonzero(row == chatml.eos_token_id).flatten().tolist()
    assert group["loss_mask"][0, end_positions].tolist() == [0.0, 1.0, 0.0, 1.0]
    check_contract(group)


def test_right_first_answer_is_one_turn(tok):
    engine = ScriptedEngine(tok, [RIGHT])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=3)
    (group,) = wf.rollout([SAMPLE], gcfg(n=2))
    prompt = prompt_ids(tok, SAMPLE["messages"])
    out0 = ids_of(tok, RIGHT) + [tok.eos_token_id]
    assert group["input_ids"].tolist() == [prompt + out0] * 2
    assert group["turn_ids"][0].tolist() == [-1] * len(prompt) + [0] * len(out0)
    assert group["rewards"].tolist() == [1.0, 1.0] and group["num_turns"].tolist() == [1.0, 1.0]
    assert len(engine.calls) == 1
    check_contract(group)


def test_episodes_batched_one_generate_call_per_turn(tok):
    """Two prompts x G=3: turn 1 is one call over exactly the episodes that answered wrong."""
    other = {"messages": [{"role": "user", "content": "Anna had 9 coins and lost 2 of them. How many coins are left?"}],
             "answer": "9 - 2 = 7\n#### 7"}
    engine = ScriptedEngine(tok, [[WRONG, RIGHT, WRONG, RIGHT, WRONG, WRONG], RIGHT, RIGHT])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=3, turn_discount=0.5)
    groups = wf.rollout([SAMPLE, other], gcfg(n=3))
    assert [len(c) for c in engine.calls] == [6, 4]
    assert groups[0]["rewards"].tolist() == [0.5, 1.0, 0.5] and groups[1]["rewards"].tolist() == [1.0, 0.5, 0.5]
    assert groups[0]["num_turns"].tolist() == [2.0, 1.0, 2.0] and groups[1]["num_turns"].tolist() == [1.0, 2.0, 2.0]
    for g in groups:
        check_contract(g)
        short = g["num_turns"] == 1  # padded to the longer rows with -1 / 0
        assert bool((g["attention_mask"][short].sum(1) < g["input_ids"].shape[1]).all())


def test_three_turns_and_discount(tok):
    engine = ScriptedEngine(tok, [WRONG, WRONG, RIGHT])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=3, turn_discount=0.9)
    (group,) = wf.rollout([SAMPLE], gcfg())
    assert group["rewards"].tolist() == [pytest.approx(0.81)] and group["num_turns"].tolist() == [3.0]
    active = group["turn_ids"][0][group["loss_mask"][0] == 1]
    assert torch.unique_consecutive(active).tolist() == [0, 1, 2]
    check_contract(group)


def test_all_wrong_stops_at_max_turns(tok):
    engine = ScriptedEngine(tok, [WRONG, WRONG, WRONG])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=2)
    (group,) = wf.rollout([SAMPLE], gcfg())
    assert len(engine.calls) == 2 and group["num_turns"].tolist() == [2.0] and group["rewards"].tolist() == [0.0]
    assert int(group["input_ids"][0, -1]) == tok.eos_token_id  # the row ends with the last answer


def test_negative_reward_is_discounted_backwards_as_every_agents(tok):
    """One rule for agents and this workflow (AReaL's ``turn_discount``): the last call's -1 reaches the first
    call, the row's, as 0.5 * -1. (The workflow before it was an agent kept a non-positive reward as is.)"""
    wf = MultiTurnWorkflow(engine=ScriptedEngine(tok, [WRONG, WRONG]), tokenizer=tok,
                           reward=reward_service("tests.plugins.minus_one"),
                           max_turns=2, turn_discount=0.5)
    (group,) = wf.rollout([SAMPLE], gcfg())
    assert group["rewards"].tolist() == [-0.5] and group["num_turns"].tolist() == [2.0]


def test_truncated_last_turn(tok):
    engine = ScriptedEngine(tok, [WRONG, "3 + 4 ="], truncated={1})
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=2)
    (group,) = wf.rollout([SAMPLE], gcfg())
    assert group["is_truncated"].tolist() == [True] and group["num_turns"].tolist() == [2.0]
    assert int(group["input_ids"][0, -1]) != tok.eos_token_id
    check_contract(group)


def test_truncated_first_turn_gets_the_full_feedback(tok):
    engine = ScriptedEngine(tok, ["3 + 4 =", RIGHT], truncated={0})
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=2)
    (group,) = wf.rollout([SAMPLE], gcfg())
    prompt = prompt_ids(tok, SAMPLE["messages"])
    feedback = feedback_ids(tok)
    out0 = ids_of(tok, "3 + 4 =")
    assert group["input_ids"][0].tolist() == prompt + out0 + feedback + ids_of(tok, RIGHT) + [tok.eos_token_id]
    assert group["is_truncated"].tolist() == [False] and group["num_turns"].tolist() == [2.0]
    check_contract(group)


def test_max_tokens_ends_the_episode(tok):
    prompt = prompt_ids(tok, SAMPLE["messages"])
    out0 = ids_of(tok, WRONG) + [tok.eos_token_id]
    engine = ScriptedEngine(tok, [WRONG, RIGHT])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=2)
    feedback = joined(feedback_ids(tok), out0, False)
    limit = len(prompt) + len(out0) + len(feedback) + 16
    (group,) = wf.rollout([SAMPLE], gcfg(max_tokens=limit - 1))
    assert len(engine.calls) == 1 and group["num_turns"].tolist() == [1.0] and group["rewards"].tolist() == [0.0]
    engine = ScriptedEngine(tok, [WRONG, RIGHT])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=2)
    (group,) = wf.rollout([SAMPLE], gcfg(max_tokens=limit))
    assert len(engine.calls) == 2 and group["num_turns"].tolist() == [2.0]


@pytest.mark.parametrize("kw", [{"max_turns": 0}, {"max_turns": True}, {"max_turns": 1.5}, {"turn_discount": 0},
                                {"turn_discount": 1.5}, {"turn_discount": float("nan")}, {"feedback": " "}])
def test_bad_kwargs(tok, kw):
    with pytest.raises(UserError, match=next(iter(kw))):
        MultiTurnWorkflow(engine=None, tokenizer=tok, reward=None, **kw)


def _turn_batch(tok):
    other = {"messages": [{"role": "user", "content": "Anna had 9 coins and lost 2 of them. How many coins are left?"}],
             "answer": "9 - 2 = 7\n#### 7"}
    engine = ScriptedEngine(tok, [[WRONG, RIGHT, WRONG, WRONG], [RIGHT, RIGHT, WRONG]])
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_runner(), max_turns=2)
    groups = wf.rollout([SAMPLE, other], gcfg(n=2))
    return concat_rows([g.rows for g in groups]).as_dict(), [g.n_rows for g in groups]


def test_turn_ids_pass_turn_gae_validation(tok):
    batch, sizes = _turn_batch(tok)
    for overrides in (["actor.gae_timestep_unit=turn"],
                      ["actor.advantage.estimator.implementation=turn_gae",
                       "actor.gae_lambda=areal_trainer.advantage.lambda_fn.relative_position_gae_lambda",
                       "+actor.gae_lambda_kwargs={q: 0.5}"]):
        built = load("grpo", overrides)
        res = built.advantage(AdvantageInputs(batch, built.config.actor,
                                              meta=TrajBatchMeta(traj_group_sizes=tuple(sizes))))
        m = res.loss_mask.bool()
        assert bool(torch.isfinite(res.advantages).all()) and bool((res.advantages[~m] == 0).all())
        # Turn-level GAE with kl_ctl = 0: one advantage per (row, turn) (batch adv_norm is affine).
        aligned = torch.roll(batch["turn_ids"], -1, dims=1)
        aligned[:, -1] = -1
        for r in range(aligned.shape[0]):
            for u in torch.unique(aligned[r][m[r]]).tolist():
                vals = res.advantages[r][m[r] & (aligned[r] == u)]
                assert torch.allclose(vals, vals[0].expand_as(vals))
    bad = dict(batch)
    bad["turn_ids"] = torch.where(batch["turn_ids"] == 1, torch.zeros_like(batch["turn_ids"]),
                                  torch.where(batch["turn_ids"] == 0, 1, batch["turn_ids"]))
    with pytest.raises(RuntimeError, match="nondecreasing"):
        built = load("grpo", ["actor.gae_timestep_unit=turn"])
        built.advantage(AdvantageInputs(bad, built.config.actor, meta=TrajBatchMeta(traj_group_sizes=tuple(sizes))))
