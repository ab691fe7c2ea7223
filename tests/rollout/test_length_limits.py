"""Answers are capped per row so that prompt + answer never exceed the row limit (``gconfig.max_tokens``
or the model's positions, the smaller): the capping function, both engines (the vLLM one through its
request parameters, with a stand-in for vLLM) and both workflows.

Hand-derived lengths with the built-in tokenizer: a user message of ``"Tom has 3 apples."`` ``k`` times
renders to ``8 + 5k`` tokens (tests/data/test_overlong_prompts.py); the built-in models have 512 positions.
"""

from __future__ import annotations

import pytest
import torch

from areal_trainer.config.sampling import GenerationHyperparameters
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_model
from areal_trainer.rollout.agents.multi_turn import MultiTurnWorkflow
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.rollout.engines.vllm import VLLMEngine
from areal_trainer.rollout.engines.weights import WeightGate
from areal_trainer.rollout.limits import capped, new_token_caps, positions_of
from areal_trainer.rollout.types import Generation
from areal_trainer.rollout.workflows.single_turn import RLVRWorkflow, prompt_ids
from tests.groups import reward_service

CPU = torch.device("cpu")
SENTENCE = "Tom has 3 apples."


@pytest.fixture(scope="module")
def model(tok):
    return build_model("builtin:tiny", tok, seed=0).eval()


def sample(k: int) -> dict:
    return {"messages": [{"role": "user", "content": " ".join([SENTENCE] * k)}], "answer": "#### 3"}


def g(**kw) -> GenerationHyperparameters:
    return GenerationHyperparameters(**{"max_new_tokens": 8, **kw})


# -- the capping function -----------------------------------------------------------------------
def test_caps_are_max_new_tokens_or_the_room_left():
    assert new_token_caps([10, 60, 62, 63], g(max_tokens=64), None) == [8, 4, 2, 1]
    assert new_token_caps([10, 60, 62], g(max_tokens=100), 66) == [8, 6, 4]  # the positions bind
    assert new_token_caps([10, 60], g(max_tokens=64), 512) == [8, 4]  # max_tokens binds
    assert new_token_caps([], g(), 512) == []
    with pytest.raises(UserError, match="a prompt of 64 tokens leaves no room for an answer within the row limit "
                                        "of 64"):
        new_token_caps([10, 64], g(max_tokens=64), None)


def test_capped_cuts_longer_answers_and_marks_them_truncated():
    short, long = (Generation([1, 2], [-0.1, -0.2], False, [0, 0]),
                   Generation([1, 2, 3, 4], [-1.0] * 4, False, [0, 1, 1, 1]))
    out = capped([short, long], [2, 3])
    assert out[0] is short
    assert out[1] == Generation([1, 2, 3], [-1.0] * 3, True, [0, 1, 1])


def test_positions_of_a_model(tok, model):
    assert positions_of(model, tok) == 512
    assert positions_of(model, tok, 300) == 300  # vLLM's max_model_len, when lower
    assert positions_of(object(), tok) is None  # no config, and the tokenizer's length is unknown


# -- the hf engine ------------------------------------------------------------------------------
def count_calls(engine, monkeypatch):
    """The ``max_new_tokens`` of each ``model.generate`` call the engine makes."""
    calls = []
    inner = engine.model.generate

    def generate(**kw):
        calls.append(kw["max_new_tokens"])
        return inner(**kw)

    monkeypatch.setattr(engine.model, "generate", generate)
    return calls


def test_hf_engine_caps_rows_by_max_tokens_in_one_call(tok, model, monkeypatch):
    engine = HFEngine(model, tok, device=CPU)
    calls = count_calls(engine, monkeypatch)
    prompts = [prompt_ids(tok, sample(k)["messages"]) for k in (1, 2)]  # 13 and 18 tokens
    torch.manual_seed(0)
    # min_new_tokens=8 keeps the stop token out, so every answer runs to its cap: 20 - 13 = 7 and 20 - 18 = 2.
    gens = engine.generate(prompts, g(max_tokens=20, min_new_tokens=8))
    assert [len(x.output_ids) for x in gens] == [7, 2] and [x.truncated for x in gens] == [True, True]
    assert [len(x.logprobs) for x in gens] == [7, 2] and [len(x.versions) for x in gens] == [7, 2]
    assert calls == [7]  # one call, to the largest cap; the other row is cut at its own


def test_hf_engine_caps_rows_by_the_models_positions(tok, model, monkeypatch):
    engine = HFEngine(model, tok, device=CPU)
    calls = count_calls(engine, monkeypatch)
    prompts = [prompt_ids(tok, sample(k)["messages"]) for k in (100, 1, 100)]  # 508, 13 and 508 tokens
    assert [len(p) for p in prompts] == [508, 13, 508]
    torch.manual_seed(0)
    gens = engine.generate(prompts, g(min_new_tokens=8))
    assert [len(x.output_ids) for x in gens] == [4, 8, 4] and all(x.truncated for x in gens)  # 512 - 508 = 4
    # Rows that would pass the model's positions in a shared call (508 + 8 > 512) are generated apart.
    assert sorted(calls) == [4, 8]


def test_hf_engine_leaves_uncapped_rows_alone(tok, model, monkeypatch):
    engine = HFEngine(model, tok, device=CPU)
    calls = count_calls(engine, monkeypatch)
    prompts = [prompt_ids(tok, sample(k)["messages"]) for k in (1, 2)]
    torch.manual_seed(0)
    gens = engine.generate(prompts, g(min_new_tokens=8))
    assert [len(x.output_ids) for x in gens] == [8, 8] and calls == [8]


def test_hf_engine_refuses_a_prompt_without_room(tok, model):
    with pytest.raises(UserError, match="no room for an answer"):
        HFEngine(model, tok, device=CPU).generate([[5] * 512], g())


# -- the vllm engine, without vLLM --------------------------------------------------------------
class FakeLLM:
    """Records the sampling parameters of each ``generate`` call; answers each row with ``max_tokens``
    copies of token 7."""

    def __init__(self):
        self.params = []

    def generate(self, prompts, params, use_tqdm=False):
        self.params.append(params)
        rows = params if isinstance(params, list) else [params] * len(prompts)

        class Out:
            def __init__(self, n):
                self.num_cached_tokens = 0
                self.outputs = [type("C", (), dict(token_ids=[7] * n,
                                                   logprobs=[{7: type("L", (), {"logprob": -1.0})}] * n,
                                                   finish_reason="length"))]

        return [Out(p["max_tokens"]) for p in rows]


def vllm_engine(tok, positions=512):
    engine = object.__new__(VLLMEngine)  # no vLLM here: only the request side is exercised
    engine.tokenizer, engine.vocab_size, engine.max_positions = tok, 100, positions
    engine.gate, engine.llm, engine._sampling_params = WeightGate(0, False), FakeLLM(), dict
    return engine


def test_vllm_sampling_params_take_a_cap(tok):
    engine = vllm_engine(tok)
    p = engine.sampling_params(g(min_new_tokens=6), n_done=2, cap=5)
    assert (p["max_tokens"], p["min_tokens"]) == (3, 3)  # 5 - 2, and min_new_tokens no more than the cap
    p = engine.sampling_params(g(min_new_tokens=6))
    assert (p["max_tokens"], p["min_tokens"]) == (8, 6)


def test_vllm_rows_of_different_caps_go_in_one_call(tok):
    engine = vllm_engine(tok)
    gens = engine.generate([[1] * 10, [1] * 508, [1] * 10], g())
    [params] = engine.llm.params
    assert [p["max_tokens"] for p in params] == [8, 4, 8]
    assert [len(x.output_ids) for x in gens] == [8, 4, 8] and all(x.truncated for x in gens)
    engine.generate([[1] * 10, [1] * 20], g())
    assert engine.llm.params[1]["max_tokens"] == 8  # uncapped: one set of parameters for all rows, as before
    with pytest.raises(UserError, match="no room"):
        engine.generate([[1] * 512], g())


# -- the workflows ------------------------------------------------------------------------------
class Overlong:
    """An engine that ignores every limit: 10 tokens per answer, no stop token."""

    max_positions = None
    version = 0

    def __init__(self):
        self.calls = []

    def generate(self, prompts, gconfig):
        self.calls.append([len(p) for p in prompts])
        return [Generation([9] * 10, [-1.0] * 10, True, [0] * 10) for _ in prompts]


def test_single_turn_rows_stay_within_the_limit_whatever_the_engine(tok):
    wf = RLVRWorkflow(engine=Overlong(), tokenizer=tok, reward=reward_service(max_error_fraction=1.0))
    groups = wf.rollout([sample(1), sample(2)], g(n_samples=2, max_tokens=20))  # 13 and 18 prompt tokens
    assert [grp["attention_mask"].sum(1).tolist() for grp in groups] == [[20, 20], [20, 20]]
    assert [grp["loss_mask"].sum(1).tolist() for grp in groups] == [[7.0, 7.0], [2.0, 2.0]]


def test_single_turn_with_the_hf_engine_at_the_models_positions(tok, model):
    wf = RLVRWorkflow(engine=HFEngine(model, tok, device=CPU), tokenizer=tok,
                      reward=reward_service(max_error_fraction=1.0))
    torch.manual_seed(0)
    [group] = wf.rollout([sample(100)], g(n_samples=2, min_new_tokens=8))
    assert group["attention_mask"].sum(1).tolist() == [512, 512] and group["is_truncated"].tolist() == [True, True]


def test_multi_turn_caps_the_first_answer_and_stops_at_the_models_positions(tok):
    engine = Overlong()
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_service(max_error_fraction=1.0), max_turns=3)
    [group] = wf.rollout([sample(1)], g(max_tokens=20))
    assert engine.calls == [[13]] and group["input_ids"].shape[1] == 20  # 13 + min(8, 7)
    # A second turn needs room for a whole answer: 13 + 8 + feedback + 8 > 40 positions, so one turn only.
    engine = Overlong()
    engine.max_positions = 40
    wf = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=reward_service(max_error_fraction=1.0), max_turns=3)
    [group] = wf.rollout([sample(1)], g())
    assert engine.calls == [[13]] and group["num_turns"].tolist() == [1.0] and group["input_ids"].shape[1] == 21
    engine.max_positions = None  # without the positions: three turns
    wf.rollout([sample(1)], g())
    assert len(engine.calls) == 4
