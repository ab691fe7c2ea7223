"""Log-probabilities: the chunked path equals a plain forward, and the rollout engine's behaviour
logprobs equal a forward of the same weights."""

import torch

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.train.models.logprobs import forward_logprobs


def _model():
    tok = build_tokenizer()
    return tok, build_model("builtin:tiny", tok, seed=0)


def test_chunked_logprobs_and_entropy_match_full_softmax():
    tok, model = _model()
    ids = torch.randint(10, len(tok), (3, 12))
    am = torch.ones_like(ids)
    am[1, 8:] = 0
    logp, ent = forward_logprobs(model, ids, am, temperature=0.7, with_entropy=True, chunk_size=5)
    full = torch.log_softmax(model(ids, attention_mask=am).logits / 0.7, -1)
    ref = full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    ref_ent = -(full.exp() * full).sum(-1)[:, :-1]
    torch.testing.assert_close(logp[0, :-1], ref[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(logp[1, :7], ref[1, :7], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[0, :-1], ref_ent[0], atol=1e-4, rtol=0)
    assert (logp[1, 7:] == 0).all() and (logp[:, -1] == 0).all()


def test_chunked_gradient_matches_full():
    tok, model = _model()
    ids = torch.randint(10, len(tok), (2, 9))
    am = torch.ones_like(ids)
    logp, _ = forward_logprobs(model, ids, am, temperature=1.0, chunk_size=4)
    logp.sum().backward()
    g1 = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad()
    full = torch.log_softmax(model(ids, attention_mask=am).logits, -1)[:, :-1].gather(-1, ids[:, 1:, None])
    full.sum().backward()
    torch.testing.assert_close(g1, model.model.embed_tokens.weight.grad, atol=1e-5, rtol=1e-4)


def test_engine_logprobs_equal_forward_of_same_weights():
    tok, model = _model()
    engine = HFEngine(model, tok, device=torch.device("cpu"))
    prompts = [[4, 20, 30, 40], [4, 21, 31]]
    torch.manual_seed(0)
    gens = engine.generate(prompts, GenerationHyperparameters(max_new_tokens=6, temperature=0.8))
    for p, g in zip(prompts, gens):
        assert len(g.output_ids) == len(g.logprobs) and 1 <= len(g.output_ids) <= 6
        ids = torch.tensor([p + g.output_ids])
        logp, _ = forward_logprobs(model, ids, torch.ones_like(ids), temperature=0.8)
        torch.testing.assert_close(logp[0, len(p) - 1:-1], torch.tensor(g.logprobs), atol=1e-5, rtol=0)
        assert g.truncated == (tok.eos_token_id not in g.output_ids)


def test_engine_logprobs_equal_packed_forward_of_a_ragged_batch():
    """Rows of different lengths in one right-padded batch: the packed forward (auto) and the padded
    one both reproduce the engine's sampling log-probabilities row by row."""
    tok, model = _model()
    engine = HFEngine(model, tok, device=torch.device("cpu"))
    prompts = [[4, 20, 30, 40, 50], [4, 21], [4, 22, 32]]
    torch.manual_seed(1)
    gens = engine.generate(prompts, GenerationHyperparameters(max_new_tokens=5, temperature=0.9))
    rows = [p + g.output_ids for p, g in zip(prompts, gens)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    am = (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    for packing in (None, False):
        logp, _ = forward_logprobs(model, ids, am, temperature=0.9, packing=packing, chunk_size=4)
        for i, (p, g) in enumerate(zip(prompts, gens)):
            torch.testing.assert_close(logp[i, len(p) - 1:len(rows[i]) - 1], torch.tensor(g.logprobs),
                                       atol=1e-5, rtol=0)


def test_builtin_vocabulary_is_what_a_tokenizer_learns_from_the_task():
    """The shipped vocabulary file equals a word-level tokenizer trained on the built-in task's text
    with the built-in pre-tokenizer (so the task and the tokenizer cannot drift apart)."""
    from tokenizers import Tokenizer, models, trainers

    from areal_trainer.data import arith
    from areal_trainer.model.builtin import SPECIALS, build_tokenizer

    shipped = build_tokenizer()
    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.pre_tokenizer = shipped.backend_tokenizer.pre_tokenizer
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS, min_frequency=1, show_progress=False)
    tk.train_from_iterator(arith.corpus() + ["user\nassistant\nsystem"], trainer)
    assert tk.get_vocab() == shipped.backend_tokenizer.get_vocab()
    question = arith.generate("test", 1)[0]["question"]
    assert shipped.unk_token_id not in shipped(question, add_special_tokens=False).input_ids
