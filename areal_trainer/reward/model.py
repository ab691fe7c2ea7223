"""A learned reward model as a reward source: one scalar score per conversation.

Two kinds of directory score:

* a Hugging Face sequence classifier (``AutoModelForSequenceClassification``, ``num_labels`` 1):
  the score is its single logit, which transformers takes at the last real token of decoder models
  (the last token that is not ``config.pad_token_id``) and at the first token of encoders;
* a critic checkpoint of this trainer (``model/critic.py``: a backbone directory plus
  ``value_head.pt``): the score is its value at the last real token, i.e. of the whole conversation.

:func:`reward_model_problems` checks a directory from its files alone, before any weights load, so a
wrong path fails at start-up with one message per problem. :class:`ModelReward` loads the model once
and scores batches of conversations.

Scoring renders each conversation (the prompt messages plus the assistant's completion) with the
reward model's *own* tokenizer and chat template, since the reward model was trained on its own
template, not the policy's. The rendered text is tokenized without the tokenizer's special tokens
when it already starts with the BOS token (templates such as Llama 3's write it themselves; adding
it again would double it), with them otherwise (encoders need their ``[CLS]``/``[SEP]``). Rows are
right-padded: real tokens keep positions ``0..L-1`` as when scored alone, including in models that
number positions without looking at the mask, and the pad id is ``config.pad_token_id``, so
transformers' own last-real-token lookup lands where it would on the unpadded row. Where the config
has no pad id, the tokenizer's is written into it (the model would otherwise refuse batches of more
than one row). Batches run in ``eval()`` mode under ``torch.no_grad()``, in micro-batches of
similar lengths (less padding), and the scores come back in the input order. Conversations longer
than the model's context are not truncated.
"""

from __future__ import annotations

import json
import os

import torch

from ..errors import UserError
from ..model.critic import HEAD_FILE, ValueModel
from ..model.load import load_tokenizer, param_dtype, resolve_device
from ..model.lora import is_adapter_dir

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model")
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def is_critic_dir(path: str) -> bool:
    """Whether ``path`` is a critic checkpoint (a backbone plus the value head) of this trainer."""
    return os.path.isfile(os.path.join(path, HEAD_FILE))


def reward_model_problems(path: str, key: str) -> list[str]:
    """What keeps ``path`` from being a reward model, one message per problem (empty: none), read
    from its files without loading weights."""
    fix = ("Give a directory holding a Hugging Face sequence-classification model with num_labels=1 "
           f"and its tokenizer, or a critic checkpoint of this trainer (with {HEAD_FILE}).")
    if not isinstance(path, str) or not os.path.isdir(path):
        return [f"{key}: {path!r} does not exist (no such directory). {fix}"]
    if is_adapter_dir(path):
        return [f"{key}: {path!r} holds a LoRA adapter, not full weights; a reward model needs full weights. "
                "Merge the adapter into its base model and save that (peft's merge_and_unload, then save_pretrained)."]
    config = _read_json(os.path.join(path, "config.json"))
    if config is None:
        return [f"{key}: {path!r} has no readable config.json, so it is not a Hugging Face model. {fix}"]
    problems = [] if is_critic_dir(path) else _classifier_problems(path, key, config)
    return problems + _tokenizer_problems(path, key)


def _classifier_problems(path: str, key: str, config: dict) -> list[str]:
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return [f"{key}: {path!r} is not a sequence classifier (architectures: {architectures}) and not a critic "
                f"checkpoint (no {HEAD_FILE}). Give a model saved from AutoModelForSequenceClassification with "
                "num_labels=1, or a critic directory written by this trainer."]
    n = num_labels(config)
    if n != 1:
        return [f"{key}: {path!r} has num_labels={n}; a reward model outputs one score (num_labels=1). Give a "
                f"reward model trained with num_labels=1: the {n} logits of a classifier are class scores, "
                "not a reward."]
    return []


def num_labels(config: dict) -> int:
    """A saved config's number of labels, as transformers reads it (``id2label``, else 2 by default)."""
    if config.get("id2label"):
        return len(config["id2label"])
    return int(config.get("num_labels") or 2)


def _tokenizer_problems(path: str, key: str) -> list[str]:
    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        return [f"{key}: {path!r} has no tokenizer files; the reward model scores text rendered with its own "
                "tokenizer. Save it there: tokenizer.save_pretrained(path)."]
    if not _has_chat_template(path):
        return [f"{key}: the tokenizer in {path!r} has no chat template; conversations are rendered with the reward "
                "model's own template. Add the template it was trained with: tokenizer.chat_template = ...; "
                "tokenizer.save_pretrained(path)."]
    return []


def _has_chat_template(path: str) -> bool:
    if any(os.path.isfile(os.path.join(path, f)) for f in _TEMPLATE_FILES):
        return True
    extra = os.path.join(path, "additional_chat_templates")
    if os.path.isdir(extra) and os.listdir(extra):
        return True
    return bool((_read_json(os.path.join(path, "tokenizer_config.json")) or {}).get("chat_template"))


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class ModelReward:
    """A reward model loaded once; :meth:`score_texts` scores conversations (see the module docstring)."""

    def __init__(self, path: str, *, device, dtype: str = "float32", micro_batch_size: int = 8,
                 name: str = "reward_model"):
        key = f"{name}.path"
        problems = reward_model_problems(path, key)
        if problems:
            raise UserError("\n".join(problems))
        if dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise UserError(f"{name}.dtype: got {dtype!r}; choose float32, bfloat16 or float16.")
        if not isinstance(micro_batch_size, int) or isinstance(micro_batch_size, bool) or micro_batch_size < 1:
            raise UserError(f"{name}.micro_batch_size: got {micro_batch_size!r}; give the rows per forward, an "
                            "integer >= 1.")
        self.name, self.path, self.micro_batch_size = name, path, micro_batch_size
        self.device = resolve_device(device) if isinstance(device, str) else torch.device(device)
        self.is_critic = is_critic_dir(path)
        self.tokenizer = load_tokenizer(path, key)
        self.model = self._load(path, key, param_dtype(dtype))
        self.model.to(self.device).eval().requires_grad_(False)
        self.pad_id = self.tokenizer.pad_token_id if self.is_critic else self._classifier_pad_id()

    def _load(self, path: str, key: str, dtype: torch.dtype) -> torch.nn.Module:
        try:
            if self.is_critic:
                return ValueModel.from_pretrained(path, dtype=dtype)
            from transformers import AutoModelForSequenceClassification

            return AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError) as e:
            raise UserError(f"{key}: cannot load the reward model in {path!r}: {str(e).splitlines()[0]}") from None

    def _classifier_pad_id(self) -> int:
        """The id rows are padded with: the model's own pad id, which transformers skips when it looks
        for the last real token; the tokenizer's (written into the config) when the model has none."""
        config = self.model.config
        if config.pad_token_id is None:
            config.pad_token_id = self.tokenizer.pad_token_id
        return config.pad_token_id

    def encode(self, conversation: list[dict]) -> list[int]:
        """The token ids of one conversation rendered with the reward model's chat template."""
        text = self.tokenizer.apply_chat_template(conversation, tokenize=False)
        bos = self.tokenizer.bos_token
        return self.tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]

    def score_texts(self, conversations: list[list[dict]]) -> list[float]:
        """One score per conversation (a list of ``{"role", "content"}`` messages), in input order."""
        rows = [self.encode(c) for c in conversations]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]), reverse=True)
        scores = [0.0] * len(rows)
        with torch.no_grad():
            for start in range(0, len(order), self.micro_batch_size):
                chunk = order[start:start + self.micro_batch_size]
                for i, score in zip(chunk, self._score_batch([rows[i] for i in chunk])):
                    scores[i] = score
        return scores

    def _score_batch(self, rows: list[list[int]]) -> list[float]:
        lengths = torch.tensor([len(r) for r in rows])
        input_ids = torch.full((len(rows), int(lengths.max())), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for b, r in enumerate(rows):
            input_ids[b, :len(r)] = torch.tensor(r, dtype=torch.long)
            attention_mask[b, :len(r)] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        if self.is_critic:
            values = self.model(input_ids, attention_mask)  # [B, S], right-padded
            scores = values[torch.arange(len(rows), device=self.device), lengths.to(self.device) - 1]
        else:
            scores = self.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]
        return scores.float().cpu().tolist()


class ModelSource:
    """A :class:`ModelReward` as a reward source of :class:`~areal_trainer.reward.service.RewardService`:
    each sample's conversation (its prompt, as chat messages, then the completion as the assistant's
    message) is scored in a thread, so the event loop and the other sources go on meanwhile."""

    def __init__(self, model: ModelReward):
        self.model, self.name, self.label = model, model.name, f"reward.model.path ({model.path})"

    @staticmethod
    def conversation(sample) -> list[dict]:
        prompt = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": str(sample.prompt)}]
        answer = sample.completion if isinstance(sample.completion, list) else [
            {"role": "assistant", "content": str(sample.completion)}]
        return [dict(m) for m in prompt] + [dict(m) for m in answer]

    async def score(self, samples) -> list[float]:
        import asyncio

        return await asyncio.to_thread(self.model.score_texts, [self.conversation(s) for s in samples])
