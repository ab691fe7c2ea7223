"""The policy being trained, as one component: its model and LoRA adapter, FSDP2 sharding, autocast,
shared-prefix setting, micro-batching, temperature, optimizer and LR schedule. It offers what a step
needs: log-probs of a batch, the update, the weights for a rollout engine, its checkpoint state.

Its life has two phases. ``PolicyModel.load`` loads the weights (from ``actor.path``, or the
checkpoint being resumed) so that the supervised warm start can train the whole base model; then
``prepare`` attaches the LoRA adapters, resolves shared-prefix training, shards the model under FSDP2
and builds the optimizer. The reference policy and the critic are copied from the policy in between
(``train/models/build.py``), before adapters and sharding.

:class:`ReferenceModel` is the frozen reference policy of the KL term: its own model, or, with LoRA and
``ref.path`` equal to ``actor.path``, the policy with its adapter turned off.
"""

from __future__ import annotations

import contextlib
import os

import torch

from ... import fsdp
from ...config.actor import PPOActorConfig
from ...errors import UserError
from ...loss import PolicyLossInputs, loss_normalizer
from ...model import lora
from ...model.load import autocast_dtype, load_causal_lm
from ...model.prefix import GroupPrefix, resolve_tree_training
from ...model.vision import freeze_vision
from ..batch import UpdateBatch
from ..state import manifest
from . import optim
from .logprobs import forward_logprobs
from .optim import build_optimizer, build_scheduler
from .update import UpdateResult, micro_batches, optimizer_steps


@torch.no_grad()
def batched_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float, mb_spec,
                     autocast: torch.dtype | None, prefix: GroupPrefix | None, vision: tuple = ()) -> torch.Tensor:
    """``[B, S]`` next-token log-probabilities under ``model``, micro-batch by micro-batch; with ``prefix``
    (the batch's prompt groups) each micro-batch's common prefixes are computed once; ``vision``: each row's
    images (empty: none). A model sharded with FSDP2 runs as many forwards on every process (``B`` may be 0 on
    some), each gathering its blocks."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    lengths = attention_mask.sum(1).tolist()
    micros = micro_batches(list(range(len(lengths))), lengths, mb_spec, prefix) if lengths else []
    # Each forward of a sharded model is a collective: agree on their number before running any.
    n_pad = fsdp.max_over_ranks(len(micros)) - len(micros) if fsdp.is_sharded(model) else 0
    for rows in micros:
        idx = torch.tensor(rows, device=out.device)
        width = max(lengths[r] for r in rows)
        logp, _ = forward_logprobs(model, input_ids[idx, :width], attention_mask[idx, :width], temperature=temperature,
                                   autocast_dtype=autocast, prefix_sharing=prefix is not None,
                                   vision=[vision[r] for r in rows] if vision else None)
        out[idx, : logp.shape[1]] = logp
    if n_pad:  # two-token forwards: keep the collectives in step, compute nothing used
        two = torch.ones((1, 2), dtype=torch.long, device=input_ids.device)
        for _ in range(n_pad):
            forward_logprobs(model, two, two, temperature=temperature, autocast_dtype=autocast, prefix_sharing=False)
    return out


class PolicyModel:
    """See the module docstring. ``cfg`` is the ``actor`` section."""

    def __init__(self, model: torch.nn.Module, cfg: PPOActorConfig, *, tokenizer, device: torch.device, dist,
                 adapter_dir: str | None, base_changed: bool):
        self.model, self.cfg, self.tokenizer, self.device, self.dist = model, cfg, tokenizer, device, dist
        self.autocast = autocast_dtype(cfg.dtype, device)
        self.adapter_dir = adapter_dir
        self.base_changed = base_changed
        """Whether the base weights differ from what ``actor.path`` loads (warm start, scratch): LoRA
        checkpoints then carry them, also those of a LoRA critic copied from the policy."""
        self.peft = None
        self.share = False
        self.colocated = False
        """The rollout generates on this very model object (synchronous training in its own precision)."""
        self.optimizer = self.scheduler = None

    @classmethod
    def load(cls, cfg: PPOActorConfig, *, tokenizer, device: torch.device, dist, seed: int,
             resume_from: str | None) -> PolicyModel:
        """The policy's weights: ``actor.path``, or the checkpoint's (a LoRA checkpoint's base: ``actor.path``
        plus its saved base weights). Settings that cannot work fail now, before any warm start."""
        adapter_dir = lora.resume_adapter_dir(resume_from, "actor", cfg.use_lora)
        actor_dir = os.path.join(resume_from, "actor") if resume_from else None
        path = actor_dir if actor_dir and not adapter_dir else cfg.path
        if path == cfg.path and (wrong := manifest.model_problem(cfg.path)) is not None:
            raise UserError(f"actor.path={cfg.path!r} is a damaged checkpoint: {wrong}. Start from an intact one (an "
                            "earlier step of the same run).")
        model = load_causal_lm(path, tokenizer=tokenizer, dtype=cfg.dtype, device=device, seed=seed,
                               init_from_scratch=cfg.init_from_scratch and path == cfg.path)
        base_changed = cfg.init_from_scratch
        if cfg.freeze_vision:
            freeze_vision(model)
        if adapter_dir:
            base_changed = lora.load_base_weights(model, adapter_dir, cfg.path)
        elif cfg.use_lora:
            lora.lora_config(cfg, model)  # bad target modules fail now, not after the warm start
        if cfg.enable_tree_training:  # an impossible =true fails now too
            resolve_tree_training(model.base_model, True, "actor.enable_tree_training")
        if cfg.gradient_checkpointing:
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        return cls(model, cfg, tokenizer=tokenizer, device=device, dist=dist, adapter_dir=adapter_dir,
                   base_changed=base_changed)

    def prepare(self, *, seed: int, total_steps: int, mesh=None) -> list[str]:
        """Ready for RL: LoRA adapters attached, shared-prefix training resolved (probed on the unsharded
        model), sharded under FSDP2 (``mesh``), optimizer and schedule built. Returns the lines to print."""
        lines = []
        if self.cfg.use_lora:
            self.peft = lora.attach(self.model, self.cfg, seed=seed, adapter_dir=self.adapter_dir)
            if self.cfg.gradient_checkpointing:  # frozen embeddings: checkpointed blocks need an input with grad
                self.model.enable_input_require_grads()
            lines.append(lora.summary(self.peft))
        self.share, line = resolve_tree_training(self.model.base_model, self.cfg.enable_tree_training,
                                                 "actor.enable_tree_training")
        lines.append(line)
        if mesh is not None:
            fsdp.shard_model(self.model, mesh)
        self.optimizer = build_optimizer(self.model.parameters(), self.cfg.optimizer)
        self.scheduler = build_scheduler(self.optimizer, self.cfg.optimizer, total_steps)
        return [x for x in lines if x]

    # -- forwards ---------------------------------------------------------------------------------------
    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: GroupPrefix | None,
                 vision: tuple = ()):
        """``[B, S]`` log-probs of the current weights (no grad; gathered under FSDP2); ``vision``: each row's
        images."""
        with fsdp.gathered(self.model):
            return batched_logprobs(self.model, input_ids, attention_mask, temperature=self.cfg.temperature,
                                    mb_spec=self.cfg.mb_spec, autocast=self.autocast,
                                    prefix=groups if self.share else None, vision=vision)

    def update(self, batch: UpdateBatch, groups: GroupPrefix | None, *, loss_fn, version: int, n_minibatches: int,
               all_reduce=None, sync_grads=None) -> UpdateResult:
        """``n_minibatches`` optimizer steps of the policy loss (see ``train/models/update.py``)."""
        cfg, prefix = self.cfg, groups if self.share else None

        def normalizer_of(sub: UpdateBatch) -> torch.Tensor:
            return loss_normalizer(sub.loss_mask, cfg.loss_agg_mode)

        def loss_of(sub: UpdateBatch, normalizer: torch.Tensor):
            logp, entropy = forward_logprobs(self.model, sub.input_ids, sub.attention_mask, temperature=cfg.temperature,
                                             with_entropy=True, autocast_dtype=self.autocast,
                                             prefix_sharing=prefix is not None, vision=sub.vision or None)
            inputs = PolicyLossInputs(logprobs=logp, policies=sub.policies, advantages=sub.advantages,
                                      loss_mask=sub.loss_mask, entropy=entropy)
            result = loss_fn(inputs, normalizer=normalizer)
            return result.loss, result.stats

        return optimizer_steps(batch, model=self.model, optimizer=self.optimizer, n_minibatches=n_minibatches,
                               mb_spec=cfg.mb_spec, grad_clip=cfg.optimizer.gradient_clipping,
                               normalizer_of=normalizer_of, loss_of=loss_of, all_reduce=all_reduce,
                               sync_grads=sync_grads, prefix=prefix)

    # -- weights --------------------------------------------------------------------------------------
    def gathered(self):
        """The whole model, unsharded under FSDP2 (for generation and no-grad forwards on it)."""
        return fsdp.gathered(self.model)

    def generating(self):
        """Where the rollout generates: on this model, gathered under FSDP2, when it is colocated."""
        return self.gathered() if self.colocated else contextlib.nullcontext()

    def rollout_weights(self, *, on_policy_object: bool, engine_samples_model: bool, stream: bool = False):
        """What a rollout engine receives after a step: the model itself when the engine samples from this
        very object (``on_policy_object``); else its weights, gathered from the shards under FSDP2, and with
        LoRA merged into the base (an engine with its own, plain weights), unless the engine samples the
        model object with the adapter active (``engine_samples_model``). ``stream``: the engine sends the
        weights on in buckets (inference servers), so sharded ones come as a :class:`fsdp.WeightStream`,
        gathered tensor by tensor as they are sent (not with LoRA, whose merge needs the whole state)."""
        weights = self.model
        if fsdp.is_sharded(self.model) and not on_policy_object:
            if stream and self.peft is None:
                return fsdp.WeightStream(self.model)
            weights = fsdp.full_state_dict(self.model, all_ranks=True)  # collective
        if self.peft is not None and not (on_policy_object and engine_samples_model):
            full = weights if isinstance(weights, dict) else None  # gathered from the shards
            weights = lora.merged_state_dict(self.peft, state=full)
        return weights

    def checkpoint_model(self):
        """What a checkpoint's ``actor/`` saves: the model, or its LoRA adapter (and changed base)."""
        if self.peft is None:
            return self.model
        return lora.AdapterCheckpoint(self.peft, self.cfg.path, self.base_changed)

    def state_dict(self) -> dict:
        return {"optimizer": fsdp.optimizer_state(self.model, self.optimizer), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        fsdp.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        optim.restore(self.optimizer, self.scheduler, self.cfg.optimizer, state["scheduler"])  # this run's settings


class ReferenceModel:
    """The frozen reference policy's log-probs: ``model`` (its own), or the policy's base with its LoRA
    adapter turned off (``model=None``)."""

    def __init__(self, model: torch.nn.Module | None, policy: PolicyModel):
        self.model, self.policy = model, policy
        self.share, self.line = policy.share, None
        if model is not None:
            self.share, line = resolve_tree_training(model.base_model, policy.cfg.enable_tree_training,
                                                     "actor.enable_tree_training")
            self.line = line if self.share != policy.share else None  # the policy's line says the same otherwise

    @contextlib.contextmanager
    def _module(self):
        if self.model is not None:
            yield self.model
            return
        with self.policy.gathered(), lora.reference_policy(self.policy.peft) as ref:
            yield ref

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: GroupPrefix | None,
                 vision: tuple = ()):
        cfg = self.policy.cfg
        with self._module() as ref:
            return batched_logprobs(ref, input_ids, attention_mask, temperature=cfg.temperature, mb_spec=cfg.mb_spec,
                                    autocast=self.policy.autocast, prefix=groups if self.share else None,
                                    vision=vision)
