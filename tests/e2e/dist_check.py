"""Worker for the data-parallel equality test: one GRPO update on a fixed global batch of 8 rows
(4 prompt groups of 2). Run alone it uses the whole batch; under a 2-process launcher each rank
takes 2 groups. It writes the advantages, the summed loss and the parameter change to
``<out>/rank<r>.pt``.

``--fsdp``: micro-batches of at most 20 tokens (so the two ranks run different numbers of them) and
gradient clipping; under ``accelerate launch --use_fsdp --fsdp_version 2`` the policy is then
sharded with FSDP2 and the parameter change is gathered in full.

``--lora``: LoRA adapters on the policy (attached before sharding); rank 0 also saves the adapter as a
checkpoint does (``adapter/``: from the gathered full state dict when sharded) and writes the merged
weights a rollout engine would receive.

``--teacher``: pure on-policy distillation (the ``distill`` preset) instead of GRPO: a second tiny model
(another seed), sharded as the trainer shards it, scores each rank's rows (also a rank with none), and
the update follows the reverse-KL loss, whose normaliser spans all processes. ``--whole-teacher``:
``teacher.shard=false``, every process holding the whole teacher."""

import sys

import torch
from torch.distributed.tensor import DTensor

from areal_trainer import fsdp
from areal_trainer.advantage import AdvantageInputs, TrajBatchMeta
from areal_trainer.advantage.align import aligned_mask
from areal_trainer.advantage.distill import distillation_only
from areal_trainer.components import load
from areal_trainer.dist import init_distributed
from areal_trainer.model import lora
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.rows import Segment, make_row, stack_rows
from areal_trainer.train.batch import TrainBatch, UpdateBatch
from areal_trainer.train.models.policy import PolicyModel
from areal_trainer.train.models.teacher import Teachers
from areal_trainer.train.models.update import balanced_partition, micro_batches
from areal_trainer.train.policies import for_loss, prepare


def global_groups():
    g = torch.Generator().manual_seed(0)
    groups = []
    for k in range(4):
        rows = []
        for j in range(2):
            prompt = torch.randint(10, 800, (5 + k,), generator=g).tolist()
            out = torch.randint(10, 800, (3 + (k + j) % 4,), generator=g).tolist()
            lp = (-torch.rand(len(out), generator=g)).tolist()
            rows.append(make_row([Segment(prompt), Segment(out, True, lp, [0] * len(out), 0)]))
        group = stack_rows(rows)
        group["rewards"] = torch.tensor([float(k % 2), float(j == 1 and k > 1)]) if k else torch.tensor([1.0, 0.0])
        group["is_truncated"] = torch.tensor([False, True])
        groups.append(group)
    return groups


def flat_params(model) -> torch.Tensor:
    """All parameters as one vector, sharded ones gathered in full (collective)."""
    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().reshape(-1).clone()
                      for p in model.parameters()])


def main(out: str, fsdp_mode: bool = False, lora_mode: bool = False, teacher_mode: bool = False) -> None:
    ctx, _ = init_distributed("cpu", fsdp=fsdp_mode)
    assert ctx.fsdp == (fsdp_mode and ctx.enabled), "parallel.fsdp was not honoured"
    extra = ["actor.mb_spec.max_tokens_per_mb=20", "actor.optimizer.gradient_clipping=0.005"] if fsdp_mode else \
        ["actor.optimizer.gradient_clipping=0"]
    if lora_mode:
        extra += ["actor.use_lora=true", "actor.lora_rank=4", "actor.lora_alpha=8"]
    if teacher_mode:
        extra += ["teacher.path=builtin:tiny", f"teacher.shard={'--whole-teacher' not in sys.argv}"]
    built = load("distill" if teacher_mode else "grpo", [
        "actor.use_decoupled_loss=false", "actor.recompute_logprob=false", "actor.rejection_sampling=null",
        "actor.ppo_n_minibatches=2", *extra])
    cfg = built.config.actor
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    peft = lora.attach(model, cfg, seed=0) if lora_mode else None
    before = flat_params(model)
    if ctx.fsdp:
        fsdp.shard_model(model, fsdp.device_mesh(torch.device("cpu"), ctx.world_size))
    groups = global_groups()
    per = len(groups) // ctx.world_size
    data = TrainBatch.from_groups(groups[ctx.rank * per:(ctx.rank + 1) * per], torch.device("cpu"))
    logps = prepare(built.plan, data.logprobs, data.versions, forward=None)  # this configuration recomputes nothing
    inputs = AdvantageInputs(data.rollout_data(), cfg, TrajBatchMeta(data.group_sizes), all_reduce=ctx.sum_fn(),
                             old_logprobs=logps.old)
    teacher = None
    if teacher_mode:  # the run's teacher, sharded under FSDP2 as a run shards it, scoring this process's rows
        mesh = fsdp.device_mesh(torch.device("cpu"), ctx.world_size) if ctx.fsdp else None
        teachers = Teachers(built.distill, {"teacher": build_model("builtin:tiny", tok, seed=1).eval()},
                            torch.device("cpu"), samples=None, mesh=mesh)
        assert teachers.sharded == (ctx.fsdp and built.distill.shard)
        teacher, _ = teachers.score(data, None, step=1)
        # A process with no rows for a teacher (MOPD) still runs its share of the collectives.
        (spec,) = built.distill.teachers
        rows = list(range(data.n_rows)) if ctx.rank == 0 else []
        again = teachers._forward(spec, data, rows, None, [2] * (len(rows) // 2))
        if rows:
            mask = aligned_mask(data.loss_mask).bool()
            torch.testing.assert_close(torch.where(mask, again, 0.0), teacher.logp, atol=1e-6, rtol=1e-5)
        adv = distillation_only(inputs)
    else:
        adv = built.advantage(inputs)
    batch = UpdateBatch(data.input_ids, data.attention_mask, adv.loss_mask, adv.advantages,
                        for_loss(built.plan, logps, adv, version=0, teacher=teacher))
    lengths = batch.attention_mask.sum(1).tolist()
    n_micro = [len(micro_batches(rows, lengths, cfg.mb_spec)) for rows in balanced_partition(lengths, 2)]
    policy = PolicyModel(model, cfg, tokenizer=tok, device=torch.device("cpu"), dist=ctx, adapter_dir=None,
                         base_changed=False)
    policy.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    result = policy.update(batch, None, loss_fn=built.loss, version=0, n_minibatches=2, all_reduce=ctx.sum_fn(),
                           sync_grads=ctx.gradient_sync())
    metrics = {k: m.value for k, m in result.metrics.items()}
    loss = ctx.all_reduce(torch.tensor(metrics["update/loss"], dtype=torch.float64))
    delta = flat_params(model) - before
    if peft is not None:
        full = fsdp.full_state_dict(model, all_ranks=True) if fsdp.is_sharded(model) else None  # collective
        merged = lora.merged_state_dict(peft, state=full)
        if fsdp.is_sharded(model):
            full = fsdp.full_state_dict(model)  # collective; on rank 0 only, as a checkpoint gathers it
        if ctx.rank == 0:
            lora.AdapterCheckpoint(peft, "builtin:tiny", save_base=True).save_pretrained(f"{out}/adapter", full)
            torch.save({k: v.cpu() for k, v in merged.items()}, f"{out}/merged.pt")
    torch.save({"advantages": adv.advantages, "loss_mask": adv.loss_mask, "loss": loss, "delta": delta,
                "rank": ctx.rank, "fsdp": fsdp.is_sharded(model), "grad_norm": metrics["update/grad_norm"],
                "n_micro": n_micro, "metrics": metrics,
                "teacher_logp": None if teacher is None else teacher.logp,
                "trainable": [n for n, p in model.named_parameters() if p.requires_grad]},
               f"{out}/rank{ctx.rank}.pt")
    ctx.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], fsdp_mode="--fsdp" in sys.argv[2:], lora_mode="--lora" in sys.argv[2:],
         teacher_mode="--teacher" in sys.argv[2:])
