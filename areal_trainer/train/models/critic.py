"""PPO's critic as one component: the value model (with its LoRA adapter, if any), FSDP2 sharding,
shared-prefix setting, micro-batching, optimizer and LR schedule; it gives a batch's values and runs
the clipped value-loss update. It is built from the policy (or ``critic.path``) in ``train/models/build.py``.
"""

from __future__ import annotations

import torch

from ... import fsdp
from ...config.actor import PPOCriticConfig
from ...loss import explained_variance, loss_normalizer, value_loss
from ...metrics import Mean
from ...model.prefix import GroupPrefix, resolve_tree_training
from ..batch import CriticBatch
from . import optim
from .optim import build_optimizer, build_scheduler
from .update import UpdateResult, micro_batches, optimizer_steps


class CriticModel:
    """The critic ``model`` (a ``ValueModel``); ``saved`` is what a checkpoint's ``critic/`` saves of it
    (the model, or its ``lora.ValueAdapterCheckpoint``). ``cfg`` is the ``critic`` section."""

    def __init__(self, model: torch.nn.Module, saved, cfg: PPOCriticConfig, *, autocast: torch.dtype | None):
        self.model, self.saved, self.cfg, self.autocast = model, saved, cfg, autocast
        self.share = False
        self.optimizer = self.scheduler = None

    def prepare(self, *, total_steps: int, mesh=None) -> list[str]:
        """Shared-prefix training resolved (on the unsharded model), sharded under FSDP2, optimizer built."""
        self.share, line = resolve_tree_training(self.model.backbone, self.cfg.enable_tree_training,
                                                 "critic.enable_tree_training")
        if mesh is not None:
            fsdp.shard_model(self.model, mesh)
        self.optimizer = build_optimizer(self.model.parameters(), self.cfg.optimizer)
        self.scheduler = build_scheduler(self.optimizer, self.cfg.optimizer, total_steps)
        return [line] if line else []

    @torch.no_grad()
    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: GroupPrefix | None,
               vision: tuple = ()):
        """``[B, S]`` values of a batch, micro-batch by micro-batch (gathered under FSDP2); ``vision``: each
        row's images."""
        prefix = groups if self.share else None
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        lengths = attention_mask.sum(1).tolist()
        with fsdp.gathered(self.model):
            for rows in micro_batches(list(range(len(lengths))), lengths, self.cfg.mb_spec, prefix):
                idx = torch.tensor(rows, device=out.device)
                width = max(lengths[r] for r in rows)
                out[idx, :width] = self.model(input_ids[idx, :width], attention_mask[idx, :width], self.autocast,
                                              prefix_sharing=prefix is not None,
                                              vision=[vision[r] for r in rows] if vision else None)
        return out

    def update(self, batch: CriticBatch, groups: GroupPrefix | None, *, n_minibatches: int, all_reduce=None,
               sync_grads=None) -> UpdateResult:
        """``n_minibatches`` optimizer steps of the clipped value loss towards ``batch.returns``; also how
        well the values the advantage used predicted the returns (before the update)."""
        prefix = groups if self.share else None

        def normalizer_of(sub: CriticBatch) -> torch.Tensor:
            return loss_normalizer(sub.loss_mask, "token-mean")

        def loss_of(sub: CriticBatch, normalizer: torch.Tensor):
            values = self.model(sub.input_ids, sub.attention_mask, self.autocast, prefix_sharing=prefix is not None,
                                vision=sub.vision or None)
            return value_loss(values, sub.old_values, sub.returns, sub.loss_mask, self.cfg.eps_clip,
                              normalizer=normalizer)

        result = optimizer_steps(batch, model=self.model, optimizer=self.optimizer, n_minibatches=n_minibatches,
                                 mb_spec=self.cfg.mb_spec, grad_clip=self.cfg.optimizer.gradient_clipping,
                                 normalizer_of=normalizer_of, loss_of=loss_of, all_reduce=all_reduce,
                                 sync_grads=sync_grads, prefix=prefix, name="critic/update")
        result.metrics["critic/explained_variance_before_update"] = Mean(float(
            explained_variance(batch.old_values, batch.returns, batch.loss_mask, all_reduce=all_reduce)))
        return result

    def state_dict(self) -> dict:
        return {"critic_optimizer": fsdp.optimizer_state(self.model, self.optimizer),
                "critic_scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        fsdp.load_optimizer_state(self.model, self.optimizer, state["critic_optimizer"])
        # this run's settings
        optim.restore(self.optimizer, self.scheduler, self.cfg.optimizer, state["critic_scheduler"])
