"""The hf engine on image prompts: it samples with each prompt's images, and its behaviour log-probs equal the
training forward's on the same rows and images; the shared prefill shares a prompt's images only among rows
with the same tokens and the same images; a weight switch inside the answers keeps every token's version and
log-prob; the single-turn workflow's groups carry the images into the batch."""

import torch
from PIL import Image

from areal_trainer.config.schema import DatasetConfig, GenerationHyperparameters
from areal_trainer.data.datasets import build_samples
from areal_trainer.model import builtin_vlm
from areal_trainer.model.vision import VisionEncoder
from areal_trainer.rollout.engines.hf import HFEngine, rollout_copy
from areal_trainer.rollout.workflows.single_turn import RLVRWorkflow
from areal_trainer.train.batch import TrainBatch
from areal_trainer.train.models.logprobs import forward_logprobs

from ..helpers import right_padded

CPU = torch.device("cpu")
TOK = builtin_vlm.build_tokenizer()
ENC = VisionEncoder(builtin_vlm.build_processor(TOK), TOK)
G = GenerationHyperparameters(max_new_tokens=8, temperature=1.0)
Q = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]}]


def _model(seed=0):
    return builtin_vlm.build_model("builtin:tiny-vlm", TOK, seed).eval()


def _prompts(samples_each=2):
    """Three pictures under one question (the same tokens, other images), each sampled twice, and a text prompt."""
    prompts, vision = [], []
    for colour in [(220, 30, 30), (30, 170, 40), (30, 60, 220)]:
        ids, v = ENC.encode(Q, [Image.new("RGB", (16, 16), colour)])
        prompts += [ids] * samples_each
        vision += [v] * samples_each
    prompts.append(ENC.encode([{"role": "user", "content": "How many apples?"}], [])[0])
    vision.append(None)
    return prompts, vision


def _forced(model, prompts, vision, gens) -> list[list[float]]:
    rows = [p + g.output_ids for p, g in zip(prompts, gens)]
    ids, am = right_padded(rows)
    logp, _ = forward_logprobs(model, ids, am, temperature=1.0, vision=vision)
    return [logp[i, len(p) - 1: len(p) - 1 + len(g.output_ids)].tolist() for i, (p, g) in enumerate(zip(prompts, gens))]


def test_behaviour_logprobs_equal_the_training_forward_on_the_same_images():
    model = _model()
    prompts, vision = _prompts()
    torch.manual_seed(0)
    gens = HFEngine(model, TOK, device=CPU).generate(prompts, G, vision=vision)
    for g, forced in zip(gens, _forced(model, prompts, vision, gens)):
        assert len(g.output_ids) >= 1 and max(abs(a - b) for a, b in zip(g.logprobs, forced)) < 1e-4
    # Recomputed with the wrong pictures, the same tokens get other log-probs: the images were seen.
    wrong = _forced(model, prompts, [vision[2], vision[3], vision[0], vision[1], *vision[4:]], gens)
    assert max(abs(a - b) for a, b in zip(gens[0].logprobs, wrong[0])) > 1e-3


def test_the_shared_prefill_shares_only_rows_with_the_same_tokens_and_images():
    model = _model()
    prompts, vision = _prompts()
    out = []
    for share in (True, False):
        torch.manual_seed(0)
        out.append(HFEngine(model, TOK, device=CPU, share_prefill=share).generate(prompts, G, vision=vision))
    shared, alone = out
    assert [g.output_ids for g in shared] == [g.output_ids for g in alone]
    for a, b in zip(shared, alone):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_a_weight_switch_inside_the_answers_keeps_each_tokens_version_and_logprob():
    old, new = _model(0), _model(1)
    prompts, vision = _prompts()
    engine = HFEngine(rollout_copy(old), TOK, device=CPU, stoppable=True)
    torch.manual_seed(0)
    engine.schedule_update(after_tokens=3, model=new, version=1)
    gens = engine.generate(prompts, G, vision=vision)
    assert all(g.versions == [0] * min(3, len(g.versions)) + [1] * (len(g.versions) - 3) for g in gens)
    assert sum(len(set(g.versions)) == 2 for g in gens) >= 3  # answers outlived the switch
    for version, model in ((0, old), (1, new)):
        forced = _forced(model, prompts, vision, gens)
        for g, f in zip(gens, forced):
            mine = [k for k, v in enumerate(g.versions) if v == version]
            assert max(abs(g.logprobs[k] - f[k]) for k in mine) < 1e-4


def test_the_workflows_groups_carry_the_images_into_the_batch():
    class Reward:
        def score_completions(self, samples, texts):
            from types import SimpleNamespace

            return SimpleNamespace(rewards=[float(len(t) % 2) for t in texts], values={},
                                   typed=lambda lo, hi: {})

    samples = build_samples(DatasetConfig(path="builtin:squares", max_rows=3), TOK, "train_dataset", vision=ENC)
    samples.append({**samples[0], "vision": None, "messages": [{"role": "user", "content": "How many apples?"}]})
    flow = RLVRWorkflow(engine=HFEngine(_model(), TOK, device=CPU), tokenizer=TOK, reward=Reward())
    torch.manual_seed(0)
    groups = flow.rollout(samples, GenerationHyperparameters(max_new_tokens=4, n_samples=2))
    assert [g.vision is None for g in groups] == [False, False, False, True]  # the text prompt has none
    assert groups[0].vision[0] is groups[0].vision[1] and groups[0].vision[0].names == samples[0]["vision"].names
    batch = TrainBatch.from_groups(groups, CPU)
    assert len(batch.vision) == 8 and batch.vision[6:] == (None, None)
    picked = batch.select(torch.tensor([6, 1]))
    assert picked.vision == (None, groups[0].vision[1])
    forced, _ = forward_logprobs(flow.engine.model, batch.input_ids, batch.attention_mask, temperature=1.0,
                                 vision=batch.vision)
    behaviour = torch.roll(batch.logprobs, -1, dims=1)
    mask = torch.roll(batch.loss_mask, -1, dims=1).bool()
    assert (forced[mask] - behaviour[mask]).abs().max() < 1e-4
