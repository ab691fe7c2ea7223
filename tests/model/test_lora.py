"""LoRA through peft (``model/lora.py``): only the adapters train, the merged weights the rollout
engines receive equal the PEFT model, the reference policy is the base with the adapter off, and bad
settings fail naming the key."""

import copy
import re

import pytest
import torch

from areal_trainer.components import load_config
from areal_trainer.config.actor import PPOActorConfig
from areal_trainer.errors import UserError
from areal_trainer.model import lora
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.rollout.engines.vllm import checkpoint_weights
from areal_trainer.rollout.engines.weights import copy_weights, rollout_copy
from areal_trainer.train.models.logprobs import forward_logprobs
from areal_trainer.train.models.optim import build_optimizer


def _setup(**kw):
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    base = copy.deepcopy(model)  # the plain model as it was before the adapters
    cfg = PPOActorConfig(use_lora=True, lora_rank=4, **kw)
    return tok, model, base, cfg, lora.attach(model, cfg, seed=0)


def _batch(tok):
    ids = torch.randint(10, len(tok), (3, 10), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids)


def _logp(model, ids, am):
    return forward_logprobs(model, ids, am, temperature=1.0)[0]


def _train_one_step(model, cfg, ids, am):
    opt = build_optimizer(model.parameters(), cfg.optimizer)
    (-_logp(model, ids, am).mean()).backward()
    opt.step()
    return opt


def test_only_adapters_train_and_base_weights_stay_bit_for_bit():
    tok, model, _, cfg, peft = _setup()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for n in trainable}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # all-linear
    n, m = lora.counts(peft)
    assert n == sum(p.numel() for n_, p in model.named_parameters() if n_ in trainable) and n < m
    assert lora.summary(peft) == f"LoRA: {n} trainable of {m} parameters ({100 * n / m:.2f}%)"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = _train_one_step(model, cfg, *_batch(tok))
    handed = {id(p) for g in opt.param_groups for p in g["params"]}
    assert handed == {id(p) for n, p in model.named_parameters() if n in trainable}
    after = model.state_dict()
    for k, v in before.items():
        if ".lora_" not in k:
            assert torch.equal(after[k], v), k
        elif ".lora_B." in k:  # B starts at 0; its first gradient is not
            assert not torch.equal(after[k], v), k


def test_merged_weights_equal_the_peft_model_and_leave_it_unchanged():
    tok, model, base, cfg, peft = _setup(lora_alpha=8)
    ids, am = _batch(tok)
    _train_one_step(model, cfg, ids, am)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    merged = lora.merged_state_dict(peft)
    assert set(merged) == set(base.state_dict())  # the base model's names
    plain = build_model("builtin:tiny", tok, seed=1)
    plain.load_state_dict(merged)
    copied = rollout_copy(base)  # a rollout engine's own copy receives the merged weights
    copy_weights(copied, merged)
    with torch.no_grad():
        want = peft(input_ids=ids, attention_mask=am).logits
        assert not torch.allclose(want, base(input_ids=ids, attention_mask=am).logits, atol=1e-4)
        for m in (plain, copied):
            torch.testing.assert_close(m(input_ids=ids, attention_mask=am).logits, want, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert "lm_head.weight" in checkpoint_weights(merged)  # what the vLLM engine loads


def test_reference_is_the_base_with_the_adapter_off():
    tok, model, base, cfg, peft = _setup()
    ids, am = _batch(tok)
    _train_one_step(model, cfg, ids, am)
    with torch.no_grad():
        with lora.reference_policy(peft) as ref:
            assert ref is model
            ref_logp = _logp(ref, ids, am)
        policy_logp = _logp(model, ids, am)
        torch.testing.assert_close(ref_logp, _logp(base, ids, am), atol=1e-6, rtol=0)
    assert not torch.allclose(policy_logp, ref_logp, atol=1e-4)  # the adapter is back on afterwards


def test_unknown_target_module_names_the_key_and_the_model_linears():
    tok = build_tokenizer()
    cfg = PPOActorConfig(use_lora=True, target_modules=["q_proj", "qkv_proj"])
    with pytest.raises(UserError) as e:
        lora.attach(build_model("builtin:tiny", tok, seed=0), cfg, seed=0)
    assert str(e.value) == ("actor.target_modules: ['qkv_proj'] not found in 'builtin:tiny'; its Linear layers are "
                            "['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'] "
                            "(or give [all-linear]).")


def test_named_target_modules_adapt_only_those():
    tok = build_tokenizer()
    model = build_model("builtin:tiny", tok, seed=0)
    lora.attach(model, PPOActorConfig(use_lora=True, target_modules=["q_proj", "v_proj"]), seed=0)
    adapted = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(adapted) == 2 * 2 * model.config.num_hidden_layers  # A and B of two projections per layer
    assert all(".q_proj.lora_" in n or ".v_proj.lora_" in n for n in adapted)


@pytest.mark.parametrize("override,message", [
    ("actor.lora_rank=0", "actor.lora_rank: got 0; must be >= 1."),
    ("actor.peft_type=ia3", "actor.peft_type: got 'ia3'; must be one of 'lora'. Only LoRA is implemented"),
    ("actor.lora_dropout=1.0", "actor.lora_dropout: got 1.0; must be in [0, 1)."),
    ("actor.target_modules=[]", "actor.target_modules: empty; name the Linear modules that get adapters"),
])
def test_bad_lora_settings_are_config_errors(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config("grpo", ["actor.use_lora=true", override])


def test_bad_critic_lora_settings_are_config_errors_naming_the_critic_key():
    assert load_config("ppo", ["critic.use_lora=true"]).critic.use_lora
    with pytest.raises(ValueError, match=re.escape("critic.lora_rank: got 0; must be >= 1.")):
        load_config("ppo", ["critic.use_lora=true", "critic.lora_rank=0"])
