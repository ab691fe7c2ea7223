"""The warm start tokenizes each drawn row once and trains exactly as if it tokenized every draw afresh:
the same losses, step for step, on plain answers and on the calculator's tool conversations."""

from __future__ import annotations

import pytest
import torch

from areal_trainer.config.schema import SFTWarmupConfig
from areal_trainer.data import arith
from areal_trainer.model import builtin
from areal_trainer.rollout.rows import stack_rows
from areal_trainer.train import sft

CFG = SFTWarmupConfig(lr=6e-3, batch_size=8, warmup_steps=2)
STEPS = 6


def _samples(n: int) -> list[dict]:
    return [{"row": f"row {i}", "messages": [{"role": "user", "content": r["question"]}], "prompt": r["question"],
             "answer": r["answer"], "fields": {"demonstration": r["demonstration"]}}
            for i, r in enumerate(arith.generate("train", n))]


def _every_draw(model, tok, samples: list[dict], seed: int) -> list[float]:
    """The warm start's loop with every drawn row tokenized at its draw (the reference)."""
    opt, sched = sft.sft_optimizer(model, CFG, STEPS)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(STEPS):
        idx = torch.randint(len(samples), (CFG.batch_size,), generator=gen).tolist()
        rows, vision = sft.sft_rows([samples[i] for i in idx], tok)
        losses.append(sft.sft_step(model, stack_rows(rows), vision, opt, sched))
    return losses


@pytest.mark.parametrize("path, tools", [("builtin:tiny", False), ("builtin:tiny-tools", True)])
def test_rows_tokenized_once_train_as_rows_tokenized_at_every_draw(monkeypatch, path, tools):
    tok = builtin.build_tokenizer(path)
    samples = _samples(5)  # 48 draws of 5 rows: every row is drawn again and again
    if tools:
        samples = sft.with_tool_demonstrations(samples)
    reference = _every_draw(builtin.build_model(path, tok, seed=0), tok, samples, seed=3)
    made = []
    real = sft.sft_rows
    monkeypatch.setattr(sft, "sft_rows", lambda rows, t: made.extend(r["row"] for r in rows) or real(rows, t))
    losses = sft.sft_warmup(builtin.build_model(path, tok, seed=0), tok, samples, CFG, steps=STEPS, seed=3,
                            device=torch.device("cpu"), progress=False)
    assert losses == reference
    assert sorted(made) == sorted(set(made)) and len(made) == 5
