"""The teachers at run time: loading (a model directory, a checkpoint step, a LoRA checkpoint), the
vocabulary check, MOPD's routing over two teachers, the shared-prefix forward against the row-by-row
one, and a non-finite teacher log-prob stopping the run."""

import os
import types

import pytest
import torch

from areal_trainer.components.distill import DistillSpec, TeacherSpec
from areal_trainer.config.parts import MicroBatchSpec
from areal_trainer.errors import UserError
from areal_trainer.model import lora
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.model.teacher import load_teacher, model_dir
from areal_trainer.train.models.logprobs import forward_logprobs
from areal_trainer.train.models.teacher import Teachers, check_teachers

TOK = build_tokenizer()


def _spec(names=("teacher",), weights=(1.0,), identifier=None, routes=None, share=None, paths=None):
    paths = paths or ["builtin:tiny"] * len(names)
    teachers = tuple(TeacherSpec(n, f"teacher.teachers.{n}.path", p, "float32", w)
                     for n, w, p in zip(names, weights, paths))
    return DistillSpec(form="mopd" if identifier else "joint", rl_weight=0.0, distill_weight=1.0, teachers=teachers,
                       identifier=identifier, routes=routes or {}, mb_spec=MicroBatchSpec(), enable_tree_training=share)


def _batch(groups):
    """Rows of prompt groups ``[(prompt ids, [answer ids, ...]), ...]``: right-padded, answers trained on."""
    rows, masks, sizes = [], [], []
    for prompt, answers in groups:
        sizes.append(len(answers))
        for a in answers:
            rows.append(prompt + a)
            masks.append([0] * len(prompt) + [1] * len(a))
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    am = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    lm = torch.tensor([m + [0] * (width - len(m)) for m in masks])
    return types.SimpleNamespace(input_ids=ids, attention_mask=am, loss_mask=lm, group_sizes=tuple(sizes),
                                 prompt_ids=tuple(range(len(groups))), vision=())


GROUPS = [([5, 6, 7, 8], [[9, 10], [9, 11, 12], [13]]), ([5, 6, 14], [[15, 16, 17], [15]])]


def _row_by_row(model, batch):
    """Every row alone, unpacked and unshared: the reference forward."""
    out = torch.zeros(batch.input_ids.shape)
    for r in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[r].sum())
        lp, _ = forward_logprobs(model, batch.input_ids[r:r + 1, :n], batch.attention_mask[r:r + 1, :n],
                                 temperature=1.0, packing=False)
        out[r, :n] = lp[0]
    aligned = torch.zeros_like(batch.loss_mask)
    aligned[:, :-1] = batch.loss_mask[:, 1:]
    return out * aligned


def test_shared_prefix_teacher_logprobs_equal_the_row_by_row_forward():
    model = build_model("builtin:tiny", TOK, 3).eval()
    batch = _batch(GROUPS)
    teachers = Teachers(_spec(share=True), {"teacher": model}, torch.device("cpu"), samples=None)
    assert teachers.share["teacher"]
    got, metrics = teachers.score(batch, None, step=1)
    want = _row_by_row(model, batch)
    assert torch.allclose(got.logp, want, rtol=1e-5, atol=1e-6), (got.logp - want).abs().max()
    aligned = want != 0
    assert torch.equal(got.weight.bool(), aligned)  # one teacher: weight 1 on trained tokens
    unshared = Teachers(_spec(share=False), {"teacher": model}, torch.device("cpu"), samples=None)
    assert not unshared.share["teacher"]
    assert torch.allclose(unshared.score(batch, None, step=1)[0].logp, want, rtol=1e-5, atol=1e-6)


def test_multi_turn_rows_are_scored_only_at_their_trained_tokens():
    """Rows of several turns (prompt | answer | feedback or tool result | answer): the teacher's log-probs are
    kept exactly where the step trains (the answers' tokens, aligned), never at the feedback's, and equal the
    whole row's forward there."""
    model = build_model("builtin:tiny", TOK, 4).eval()
    segments = [  # (ids, trained) per row
        [([5, 6, 7], 0), ([9, 10], 1), ([21, 22, 23], 0), ([11, 12, 13], 1)],
        [([5, 6, 7], 0), ([14], 1), ([24, 25], 0), ([15, 16], 1), ([26], 0), ([17], 1)],
    ]
    rows = [[t for ids, _ in r for t in ids] for r in segments]
    masks = [[m for ids, m in r for _ in ids] for r in segments]
    width = max(map(len, rows))
    batch = types.SimpleNamespace(
        input_ids=torch.tensor([r + [0] * (width - len(r)) for r in rows]),
        attention_mask=torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        loss_mask=torch.tensor([m + [0] * (width - len(m)) for m in masks]), group_sizes=(2,), prompt_ids=(0,),
        vision=())
    got, _ = Teachers(_spec(share=True), {"teacher": model}, torch.device("cpu"), samples=None).score(batch, None, 1)
    want = _row_by_row(model, batch)
    trained_next = torch.zeros_like(batch.loss_mask)
    trained_next[:, :-1] = batch.loss_mask[:, 1:]  # position t scores token t+1
    assert torch.equal(got.weight.bool(), trained_next.bool())
    assert (got.logp[~trained_next.bool()] == 0).all() and (got.logp[trained_next.bool()] < 0).all()
    assert int(trained_next.sum()) == 5 + 4  # the answers' tokens; none of the 3 + 2 + 1 feedback tokens
    assert torch.allclose(got.logp, want, rtol=1e-5, atol=1e-6)


def test_mopd_routes_rows_to_two_teachers_with_unnormalised_weights():
    a, b = build_model("builtin:tiny", TOK, 1).eval(), build_model("builtin:tiny", TOK, 2).eval()
    groups = [GROUPS[0], GROUPS[1], ([5, 6], [[7], [8, 9]])]
    samples = [{"fields": {"task_type": v}} for v in ("a", "both", "b")]
    spec = _spec(("a", "b"), (1.0, 0.5), identifier="task_type", routes={"both": {"a": 2.0, "b": 0.5}})
    batch = _batch(groups)
    got, metrics = Teachers(spec, {"a": a, "b": b}, torch.device("cpu"), samples).score(batch, None, step=4)
    ta, tb = _row_by_row(a, batch), _row_by_row(b, batch)
    m = torch.zeros_like(batch.loss_mask, dtype=torch.float32)
    m[:, :-1] = batch.loss_mask[:, 1:].float()
    want = torch.cat([ta[0:3], 2.0 * ta[3:5] + 0.5 * tb[3:5], 0.5 * tb[5:7]])  # "b" by name: its own weight 0.5
    assert torch.allclose(got.logp, want, rtol=1e-5, atol=1e-6)
    weight = torch.cat([m[0:3], 2.5 * m[3:5], 0.5 * m[5:7]])
    assert torch.equal(got.weight, weight)
    assert metrics["distill/teacher_rows/a"].value == 5 and metrics["distill/teacher_rows/b"].value == 4


def test_a_row_whose_route_has_no_teacher_is_an_error_naming_the_value():
    model = build_model("builtin:tiny", TOK, 1).eval()
    spec = _spec(("a", "b"), (1.0, 1.0), identifier="task_type")
    samples = [{"fields": {"task_type": "a"}}, {"fields": {"task_type": "poetry"}}]
    teachers = Teachers(spec, {"a": model, "b": model}, torch.device("cpu"), samples)
    with pytest.raises(UserError, match=r"task_type='poetry'.*teachers are a, b") as info:
        teachers.score(_batch(GROUPS), None, step=2)
    assert "teacher.mopd.routes.poetry" in str(info.value) and "training row 1" in str(info.value)
    # and at start-up, before any weights load, over the whole training set
    with pytest.raises(UserError, match="poetry"):
        check_teachers(spec, TOK, student_key="actor.path", student_path="builtin:tiny", samples=samples)


def test_a_non_finite_teacher_logprob_at_a_trained_token_stops_the_run_naming_teacher_and_step():
    model = build_model("builtin:tiny", TOK, 1).eval()
    with torch.no_grad():
        model.lm_head.weight[9] = float("nan")  # token 9 is sampled in the first group
    teachers = Teachers(_spec(("math",), (1.0,)), {"math": model}, torch.device("cpu"), None)
    with pytest.raises(UserError, match=r"teacher 'math'.*non-finite log-probability.*at step 7"):
        teachers.score(_batch(GROUPS), None, step=7)


def test_a_teacher_with_another_vocabulary_is_an_error_naming_both(tmp_path):
    other = build_tokenizer()
    other.add_tokens(["zyzzyva"])
    other.save_pretrained(tmp_path / "t")
    spec = _spec(paths=[str(tmp_path / "t")])
    with pytest.raises(UserError) as info:
        check_teachers(spec, TOK, student_key="actor.path", student_path="builtin:tiny", samples=[])
    msg = str(info.value)
    assert "teacher.teachers.teacher.path" in msg and str(tmp_path / "t") in msg and "actor.path='builtin:tiny'" in msg
    assert "zyzzyva" in msg
    check_teachers(_spec(paths=["builtin:small"]), TOK, student_key="actor.path", student_path="builtin:tiny",
                   samples=[])  # the built-in sizes share one tokenizer


def _same_outputs(a, b):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        return torch.allclose(a(input_ids=ids).logits, b(input_ids=ids).logits, atol=1e-5)


def test_teacher_from_a_model_directory_and_from_a_checkpoint_step(tmp_path):
    model = build_model("builtin:tiny", TOK, 5)
    step = tmp_path / "checkpoints" / "step_3"
    model.save_pretrained(step / "actor")
    TOK.save_pretrained(step / "actor")
    (step / "trainer_state.pt").write_bytes(b"")
    assert model_dir(str(step)) == str(step / "actor")
    for path in (step, step / "actor"):
        t = load_teacher(str(path), tokenizer=TOK, dtype="float32", device=torch.device("cpu"), seed=0,
                         key="teacher.path")
        assert not t.training and not any(p.requires_grad for p in t.parameters())
        assert _same_outputs(t, model)


def test_teacher_from_a_lora_checkpoint_is_its_base_with_the_adapter_merged(tmp_path):
    cfg = types.SimpleNamespace(target_modules=["all-linear"], lora_rank=4, lora_alpha=8, lora_dropout=0.0,
                                path="builtin:tiny")
    model = build_model("builtin:tiny", TOK, 1)
    with torch.no_grad():  # a warm-started base (saved by the checkpoint) and a non-zero adapter
        model.lm_head.weight.mul_(1.5)
    peft = lora.attach(model, cfg, seed=0)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    out = tmp_path / "actor"
    lora.AdapterCheckpoint(peft, "builtin:tiny", save_base=True).save_pretrained(str(out))
    TOK.save_pretrained(str(out))
    assert os.path.isfile(out / lora.BASE_FILE)
    t = load_teacher(str(out), tokenizer=TOK, dtype="float32", device=torch.device("cpu"), seed=1, key="teacher.path")
    assert type(t).__name__ == "LlamaForCausalLM"  # one plain model, the adapter merged in
    assert _same_outputs(t, peft)
