"""Reward models: a tiny sequence classifier and a tiny critic checkpoint score conversations exactly
as a manual one-at-a-time forward does, whatever the batching; directories that are not reward
models are named with the problem before any weights load."""

import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from areal_trainer.errors import UserError
from areal_trainer.model import builtin
from areal_trainer.model.critic import ValueModel
from areal_trainer.reward.model import ModelReward, reward_model_problems

KEY = "reward_model.path"
CONVERSATIONS = [
    [{"role": "user", "content": "Tom has 3 apples. Tom buys 4 more. How many apples does Tom have now?"},
     {"role": "assistant", "content": "3 + 4 = 7\n#### 7"}],
    [{"role": "user", "content": "Anna had 9 pens and lost 2 of them. How many are left?"},
     {"role": "assistant", "content": "#### 7"}],
    [{"role": "user", "content": "How many?"}, {"role": "assistant", "content": "5"}],
    [{"role": "user", "content": "There are 12 books in a box and 5 books on the table. How many books are there "
                                 "in total?"},
     {"role": "assistant", "content": "12 + 5 = 17. Then 17 books.\n#### 17"}],
    [{"role": "user", "content": "Sam has 2 coins."}, {"role": "assistant", "content": "2"}],
]


def tiny_config(tok, cls=LlamaConfig, **kwargs) -> LlamaConfig:
    return cls(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=2, max_position_embeddings=256, bos_token_id=tok.bos_token_id,
               eos_token_id=tok.eos_token_id, **kwargs)


def save(model, tok, path) -> str:
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def classifier_dir(tok, tmp_path_factory):
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(tiny_config(tok, num_labels=1, pad_token_id=tok.pad_token_id))
    return save(model, tok, tmp_path_factory.mktemp("classifier"))


def manual_scores(model, tok, conversations, add_special_tokens=True):
    """One conversation at a time, no padding."""
    out = []
    with torch.no_grad():
        for conv in conversations:
            text = tok.apply_chat_template(conv, tokenize=False)
            ids = torch.tensor([tok(text, add_special_tokens=add_special_tokens)["input_ids"]])
            out.append(float(model(input_ids=ids).logits[0, 0]))
    return out


def test_classifier_scores_equal_unbatched_forwards(classifier_dir, tok):
    reward = ModelReward(classifier_dir, device="cpu", micro_batch_size=8)
    scores = reward.score_texts(CONVERSATIONS)
    model = LlamaForSequenceClassification.from_pretrained(classifier_dir).eval()
    expected = manual_scores(model, tok, CONVERSATIONS)
    assert len(set(map(len, map(reward.encode, CONVERSATIONS)))) > 1  # the batch really is padded
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(scores)) == len(scores)
    assert not any(p.requires_grad for p in reward.model.parameters()) and not reward.model.training


def test_micro_batch_size_does_not_change_scores(classifier_dir):
    base = ModelReward(classifier_dir, device="cpu", micro_batch_size=8).score_texts(CONVERSATIONS)
    for mbs in (1, 2, 3):
        assert ModelReward(classifier_dir, device="cpu", micro_batch_size=mbs).score_texts(CONVERSATIONS) == \
            pytest.approx(base, abs=1e-5)
    assert ModelReward(classifier_dir, device="cpu").score_texts([]) == []


def test_config_without_pad_id_gets_the_tokenizers(tok, tmp_path):
    torch.manual_seed(1)
    model = LlamaForSequenceClassification(tiny_config(tok, num_labels=1)).eval()
    assert model.config.pad_token_id is None
    path = save(model, tok, tmp_path / "nopad")
    reward = ModelReward(path, device="cpu")
    assert reward.model.config.pad_token_id == tok.pad_token_id
    assert reward.score_texts(CONVERSATIONS) == pytest.approx(manual_scores(model, tok, CONVERSATIONS), abs=1e-5)


def test_dtype(classifier_dir):
    reward = ModelReward(classifier_dir, device="cpu", dtype="bfloat16")
    assert next(reward.model.parameters()).dtype == torch.bfloat16
    assert all(isinstance(s, float) for s in reward.score_texts(CONVERSATIONS[:2]))


def test_critic_checkpoint_scores_its_value_at_the_last_token(tok, tmp_path):
    torch.manual_seed(2)
    critic = ValueModel.from_causal_lm(LlamaForCausalLM(tiny_config(tok, pad_token_id=tok.pad_token_id)))
    torch.nn.init.normal_(critic.value_head.weight)  # the zero initial head would score everything 0
    torch.nn.init.normal_(critic.value_head.bias)
    critic.eval()
    path = str(tmp_path / "critic")
    critic.save_pretrained(path)
    tok.save_pretrained(path)
    assert reward_model_problems(path, KEY) == []
    reward = ModelReward(path, device="cpu", micro_batch_size=2)
    expected = []
    with torch.no_grad():
        for ids in map(reward.encode, CONVERSATIONS):
            hidden = critic.backbone(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            expected.append(float(critic.value_head(hidden)))
    assert reward.score_texts(CONVERSATIONS) == pytest.approx(expected, abs=1e-5)


def test_problems_of_good_and_bad_directories(classifier_dir, tok, tmp_path):
    assert reward_model_problems(classifier_dir, KEY) == []

    causal = save(LlamaForCausalLM(tiny_config(tok)), tok, tmp_path / "causal")
    [p] = reward_model_problems(causal, KEY)
    assert p.startswith(KEY) and "not a sequence classifier" in p and "LlamaForCausalLM" in p and "num_labels=1" in p

    two = save(LlamaForSequenceClassification(tiny_config(tok, num_labels=2)), tok, tmp_path / "two")
    [p] = reward_model_problems(two, KEY)
    assert p.startswith(KEY) and "num_labels=2" in p and "num_labels=1" in p

    plain_tok = builtin.build_tokenizer()
    plain_tok.chat_template = None
    no_template = save(LlamaForSequenceClassification(tiny_config(tok, num_labels=1)), plain_tok,
                       tmp_path / "no_template")
    assert not os.path.exists(os.path.join(no_template, "chat_template.jinja"))
    [p] = reward_model_problems(no_template, KEY)
    assert p.startswith(KEY) and "no chat template" in p and "tokenizer.chat_template" in p

    missing = str(tmp_path / "nowhere")
    [p] = reward_model_problems(missing, KEY)
    assert p.startswith(KEY) and repr(missing) in p and "does not exist" in p
    with pytest.raises(UserError, match="does not exist"):
        ModelReward(missing, device="cpu")


def test_num_labels_from_saved_fields(tmp_path, classifier_dir):
    config = json.load(open(os.path.join(classifier_dir, "config.json")))
    for fields, expected in (({"id2label": {"0": "a", "1": "b", "2": "c"}}, "num_labels=3"),
                             ({"id2label": None, "num_labels": 1}, None), ({"id2label": None}, "num_labels=2")):
        path = tmp_path / f"cfg{len(os.listdir(tmp_path))}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps({**config, **fields}))
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (path / name).write_bytes(open(os.path.join(classifier_dir, name), "rb").read())
        problems = reward_model_problems(str(path), KEY)
        assert (problems == []) if expected is None else (expected in problems[0])
