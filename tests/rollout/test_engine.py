"""The hf engine's weight updates during a generation: an update interrupts at a token boundary and
the answers continue under the new weights (each token keeps the version that sampled it, and its
behaviour logprob is that of the weights that sampled it); without interruption the update waits;
an abort stops generation."""

import threading
import time

import pytest
import torch

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.model.builtin import build_model
from areal_trainer.rollout.engines.hf import GenerationAborted, HFEngine, rollout_copy
from areal_trainer.rollout.workflows.single_turn import prompt_ids
from areal_trainer.train.models.logprobs import forward_logprobs

CPU = torch.device("cpu")
G = GenerationHyperparameters(max_new_tokens=12, temperature=1.0)


def _models(tok):
    old = build_model("builtin:tiny", tok, seed=0).eval()
    new = build_model("builtin:tiny", tok, seed=1).eval()
    return old, new


def _prompts(tok, n=6):
    return [prompt_ids(tok, [{"role": "user", "content": f"What is {i} + {i + 2}?"}]) for i in range(n)]


def _teacher_forced(model, prompt, answer) -> list[float]:
    ids = torch.tensor([prompt + answer])
    logp, _ = forward_logprobs(model, ids, torch.ones_like(ids), temperature=1.0)
    return logp[0, len(prompt) - 1: len(prompt) - 1 + len(answer)].tolist()


def _check_versions_and_logprobs(gens, prompts, models):
    for prompt, gen in zip(prompts, gens):
        assert gen.versions == sorted(gen.versions)  # a later token never has an older version
        for v in set(gen.versions):
            forced = _teacher_forced(models[v], prompt, gen.output_ids)
            mine = [k for k, x in enumerate(gen.versions) if x == v]
            assert max(abs(gen.logprobs[k] - forced[k]) for k in mine) < 1e-4


def test_scheduled_switch_continues_answers_under_the_new_weights(tok):
    old, new = _models(tok)
    engine = HFEngine(rollout_copy(old), tok, device=CPU, stoppable=True)
    prompts = _prompts(tok)
    torch.manual_seed(0)
    engine.schedule_update(after_tokens=4, model=new, version=1)
    gens = engine.generate(prompts, G)
    assert engine.version == 1
    two = [g for g in gens if len(set(g.versions)) == 2]
    assert two, "some answer must have outlived the switch"
    for g in two:
        assert g.versions[:4] == [0] * 4 and set(g.versions[4:]) == {1}
    for g in gens:
        assert len(g.output_ids) <= G.max_new_tokens and g.truncated == (g.output_ids[-1] != tok.eos_token_id)
    _check_versions_and_logprobs(gens, prompts, {0: old, 1: new})


def _slow_down(model, started: threading.Event, until, after: int = 3, delay: float = 0.05):
    """Slow down the model's forwards from the ``after``-th on (and say so), and hold that forward until
    ``until()`` holds (an update or abort from another thread is on its way): so that it lands while
    answers are still being sampled, however slow that thread is."""
    inner = model.forward
    calls = [0]

    def forward(*args, **kwargs):
        calls[0] += 1
        if calls[0] >= after:
            started.set()
            deadline = time.monotonic() + 60
            while calls[0] == after and not until():
                assert time.monotonic() < deadline, "no update or abort came"
                time.sleep(0.001)
            time.sleep(delay)
        return inner(*args, **kwargs)

    model.forward = forward
    return calls


def test_update_from_another_thread_interrupts_and_continues(tok):
    old, new = _models(tok)
    copy = rollout_copy(old)
    engine = HFEngine(copy, tok, device=CPU, interruptible=True)
    started = threading.Event()
    _slow_down(copy, started, engine.gate.pending)
    prompts = _prompts(tok)
    out = {}
    g = GenerationHyperparameters(max_new_tokens=30, temperature=1.0)
    th = threading.Thread(target=lambda: out.setdefault("gens", engine.generate(prompts, g)), daemon=True)
    th.start()
    assert started.wait(30)
    engine.update_weights(new, 1)  # returns once the weights are in: the generation is paused meanwhile
    th.join(60)
    gens = out["gens"]
    assert engine.interruptions == 1 and engine.version == 1
    n_old = max(gen.versions.count(0) for gen in gens)
    continued = [gen for gen in gens if len(gen.output_ids) > n_old]
    assert continued, "an answer must have outlived the update"
    for gen in continued:  # interrupted at one token boundary, then sampled by the new weights
        assert gen.versions == [0] * n_old + [1] * (len(gen.output_ids) - n_old)
    _check_versions_and_logprobs(gens, prompts, {0: old, 1: new})


def test_without_interruption_the_update_waits_for_the_call(tok):
    old, new = _models(tok)
    copy = rollout_copy(old)
    engine = HFEngine(copy, tok, device=CPU, interruptible=False, stoppable=True)
    started = threading.Event()
    calls = _slow_down(copy, started, lambda: engine.gate._updating)  # held until the update waits
    out = {}
    g = GenerationHyperparameters(max_new_tokens=20, min_new_tokens=20, temperature=1.0)
    th = threading.Thread(target=lambda: out.setdefault("gens", engine.generate(_prompts(tok, 2), g)), daemon=True)
    th.start()
    assert started.wait(30)
    engine.update_weights(new, 1)
    forwards = calls[0]
    th.join(60)
    assert forwards == calls[0] >= 20  # it waited for the generation to finish: no forward came after it
    assert all(set(gen.versions) == {0} for gen in out["gens"])
    assert engine.version == 1 and engine.interruptions == 0


def test_abort_stops_the_generation(tok):
    old, _ = _models(tok)
    copy = rollout_copy(old)
    engine = HFEngine(copy, tok, device=CPU, stoppable=True)
    started = threading.Event()
    _slow_down(copy, started, lambda: engine.gate.aborted)
    errors = []

    def run():
        try:
            engine.generate(_prompts(tok, 2), GenerationHyperparameters(max_new_tokens=200, min_new_tokens=200))
        except GenerationAborted as e:
            errors.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert started.wait(30)
    engine.abort()
    th.join(30)
    assert not th.is_alive() and errors
    with pytest.raises(GenerationAborted):
        engine.generate(_prompts(tok, 1), G)


def test_rollout_copy_in_bfloat16_samples_with_its_own_precision(tok):
    model = build_model("builtin:tiny", tok, seed=0).eval()
    copy = rollout_copy(model, torch.bfloat16)
    assert next(copy.parameters()).dtype == torch.bfloat16 and not next(copy.parameters()).requires_grad
    engine = HFEngine(copy, tok, device=CPU, stoppable=True)
    torch.manual_seed(0)
    gens = engine.generate(_prompts(tok, 4), G)
    diffs = [abs(a - b) for gen, p in zip(gens, _prompts(tok, 4))
             for a, b in zip(gen.logprobs, _teacher_forced(model, p, gen.output_ids))]
    assert 1e-4 < max(diffs) < 0.5  # a real but small train/inference mismatch
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    engine.update_weights(model, 1)  # copied into the bf16 copy, cast
    assert next(copy.parameters()).dtype == torch.bfloat16
    torch.testing.assert_close(next(copy.parameters()).float(), next(model.parameters()), atol=0.02, rtol=0.01)
