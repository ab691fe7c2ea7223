"""HF generation prefills each distinct prompt once: the samples of a prompt share its key/value
cache, and what is sampled (tokens, behaviour log-probabilities) is what the unshared path samples
with the same seed."""

import pytest
import torch

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.data import arith
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.engines.hf import HFEngine


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    prompts = [tok.encode(p["question"]) for p in arith.generate("train", 4)]
    return tok, model, prompts


def _generate(tok, model, rows, share, **gen):
    engine = HFEngine(model, tok, device=torch.device("cpu"), share_prefill=share)
    calls = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        torch.manual_seed(7)
        out = engine.generate(rows, GenerationHyperparameters(max_new_tokens=12, **gen))
    finally:
        hook.remove()
    return out, calls


@pytest.mark.parametrize("greedy", [False, True])
def test_shared_prefill_samples_what_the_unshared_path_samples(setup, greedy):
    tok, model, prompts = setup
    rows = [p for p in prompts for _ in range(4)]  # 4 samples of each of 4 prompts
    plain, plain_calls = _generate(tok, model, rows, False, greedy=greedy)
    shared, shared_calls = _generate(tok, model, rows, True, greedy=greedy)
    assert [g.output_ids for g in shared] == [g.output_ids for g in plain]
    for a, b in zip(shared, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        assert a.truncated == b.truncated
    width = max(map(len, prompts))
    assert plain_calls[0] == (16, width)  # every row prefilled
    assert shared_calls[0] == (4, width - 1)  # each prompt once (all but its last token) ...
    assert shared_calls[1] == (16, 1)  # ... then generate starts from the last prompt token
    assert all(length == 1 for _, length in shared_calls[1:])  # no row is prefilled again


def test_distinct_prompts_are_not_prefilled_separately(setup):
    tok, model, prompts = setup
    _, calls = _generate(tok, model, prompts, True)
    assert calls[0] == (4, max(map(len, prompts)))  # nothing to share: the ordinary generate
