"""LoRA for the critic (``critic.use_lora``): adapters on the value model's backbone, its value head fully
trained and the base frozen; the checkpoint (adapter, head, base when it changed) restores the critic
exactly, also from a gathered full state dict (FSDP2); bad target modules name ``critic.target_modules``."""

import os

import pytest
import torch

from areal_trainer.components import load_config
from areal_trainer.errors import UserError
from areal_trainer.loss import value_loss
from areal_trainer.model import lora
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.model.critic import HEAD_FILE
from areal_trainer.train.models.build import build_critic, check_critic_lora
from areal_trainer.train.models.optim import build_optimizer

CPU = torch.device("cpu")


def _cfg(*extra):
    return load_config("ppo", ["critic.use_lora=true", "critic.lora_rank=4", *extra])


def _critic(cfg, resume_dir=None, policy_changed=False):
    tok = build_tokenizer()
    actor = build_model("builtin:tiny", tok, seed=cfg.seed)
    return build_critic(cfg, actor, tok, CPU, resume_dir, policy_changed=policy_changed)


def _batch():
    ids = torch.randint(10, 200, (3, 9), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, 6:] = 0
    return ids, am


def _train(critic, cfg, steps=2):
    """``steps`` optimizer steps of the value loss. The zero-initialised head passes no gradient to the
    backbone on the first step, so the adapters move from the second one on."""
    ids, am = _batch()
    opt = build_optimizer(critic.parameters(), cfg.critic.optimizer)
    for _ in range(steps):
        opt.zero_grad()
        values = critic(ids, am)
        loss = value_loss(values, torch.zeros_like(values), torch.ones_like(values), am.float(), 0.5,
                          normalizer=am.sum().float())[0]
        loss.backward()
        opt.step()
    return opt


def test_only_the_adapters_and_the_value_head_train():
    cfg = _cfg()
    critic, saved = _critic(cfg)
    assert isinstance(saved, lora.ValueAdapterCheckpoint) and saved.module is critic
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert {"value_head.weight", "value_head.bias"} <= trainable
    adapters = trainable - {"value_head.weight", "value_head.bias"}
    assert adapters and all(n.startswith("backbone.") and (".lora_A." in n or ".lora_B." in n) for n in adapters)
    assert len(adapters) == 2 * 7 * 4  # A and B of every projection (all-linear) of the 4 layers
    before = {k: v.clone() for k, v in critic.state_dict().items()}
    opt = _train(critic, cfg)
    assert {id(p) for g in opt.param_groups for p in g["params"]} == \
        {id(p) for n, p in critic.named_parameters() if n in trainable}
    for n, p in critic.named_parameters():
        assert (p.grad is not None) == (n in trainable), n
    after = critic.state_dict()
    for k, v in before.items():
        if ".lora_" not in k and not k.startswith("value_head."):
            assert torch.equal(after[k], v), k  # frozen base
    assert not torch.equal(after["value_head.bias"], before["value_head.bias"])
    assert any(not torch.equal(after[k], before[k]) for k in before if ".lora_B." in k)


@pytest.mark.parametrize("gathered", [False, True], ids=["own-state", "gathered-state"])
def test_checkpoint_restores_the_trained_critic_exactly(tmp_path, gathered):
    cfg = _cfg()
    critic, saved = _critic(cfg, policy_changed=True)
    _train(critic, cfg)
    path = tmp_path / "step_1" / "critic"
    # Under FSDP2 the run passes the full state dict it gathered; without, the critic's own is read.
    saved.save_pretrained(str(path), **({"state_dict": critic.state_dict()} if gathered else {}))
    names = set(os.listdir(path))
    assert {"adapter_config.json", "adapter_model.safetensors", HEAD_FILE, lora.BASE_INFO, lora.BASE_FILE} <= names
    restored, again = _critic(cfg, resume_dir=str(tmp_path / "step_1"))
    assert again.save_base  # still carries its base weights in the next checkpoint
    want, got = critic.state_dict(), restored.state_dict()
    assert set(want) == set(got)
    for k in want:
        assert torch.equal(want[k], got[k]), k
    assert {n for n, p in restored.named_parameters() if p.requires_grad} == \
        {n for n, p in critic.named_parameters() if p.requires_grad}
    ids, am = _batch()
    with torch.no_grad():
        assert torch.equal(restored(ids, am), critic(ids, am))


def test_an_unchanged_base_is_not_saved(tmp_path):
    cfg = _cfg()
    critic, saved = _critic(cfg)
    saved.save_pretrained(str(tmp_path / "c"))
    assert not (tmp_path / "c" / lora.BASE_FILE).exists()


def test_resuming_a_full_critic_with_lora_names_the_key(tmp_path):
    cfg = load_config("ppo", [])
    critic, saved = _critic(cfg)
    assert saved is critic
    saved.save_pretrained(str(tmp_path / "critic"))
    with pytest.raises(UserError) as e:
        _critic(_cfg(), resume_dir=str(tmp_path))
    assert str(e.value) == (f"critic.use_lora=true: {tmp_path / 'critic'} holds full weights, not a LoRA adapter; "
                            "resume it with critic.use_lora=false.")


def test_unknown_critic_target_module_names_the_key_and_the_model_linears():
    cfg = _cfg("critic.target_modules=[q_proj,qkv_proj]")
    tok = build_tokenizer()
    want = ("critic.target_modules: ['qkv_proj'] not found in 'builtin:tiny'; its Linear layers are "
            "['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'] (or give [all-linear]).")
    with pytest.raises(UserError) as e:  # the start-up check, against the policy
        check_critic_lora(cfg, build_model("builtin:tiny", tok, seed=0), tok)
    assert str(e.value) == want
    other = load_config("ppo", ["critic.use_lora=true", "critic.path=builtin:small",
                                "critic.target_modules=[qkv_proj]"])
    with pytest.raises(UserError, match=r"critic\.target_modules: \['qkv_proj'\] not found in 'builtin:small'"):
        check_critic_lora(other, build_model("builtin:tiny", tok, seed=0), tok)  # its own model, weightless
    with pytest.raises(UserError) as e:  # building the critic says the same
        _critic(cfg)
    assert str(e.value) == want
