"""The prompt datasets (``train_dataset``, ``valid_dataset``): where the rows come from, their columns, and
how a row becomes the prompt. Key names follow AReaL's ``DatasetConfig`` where AReaL has the key."""

import dataclasses
import string
from dataclasses import dataclass
from typing import Optional

from .base import Checked, at_least_one, one_of

OVERLONG_PROMPTS = (None, "drop", "error")
"""The values of ``overlong_prompts`` (null: ``drop``)."""
BAD_IMAGES = (None, "error", "skip")
"""The values of ``bad_images`` (null: ``error``)."""


@dataclass
class DatasetConfig(Checked):
    """A prompt dataset: ``builtin:arith`` (generated offline), a HF hub id, or local files; rows with a prompt
    (text or chat messages), an optional answer and any other columns (``data/datasets.py``; shapes, column
    keys and worked examples: docs/tasks.md)."""

    path: str = "builtin:arith"
    """``builtin:arith``, a HF hub dataset id, a local ``.jsonl``/``.json``/``.parquet``/``.csv`` file, a
    directory of such files, or a glob (``data/train-*.jsonl``)."""
    name: Optional[str] = None
    """HF dataset config name (``main`` for openai/gsm8k)."""
    split: str = "train"
    """Split to load from a HF dataset (``builtin:arith`` has ``train`` and ``test``); local files are one split."""
    type: str = "rl"
    """AReaL's dataset type; only ``rl`` (prompts, with reference answers where the rows have them)."""
    batch_size: int = 8
    """Prompts per step (each sampled gconfig.n_samples times)."""
    shuffle: bool = True
    """train_dataset: the prompts come in a new seeded order every epoch (false: file order). valid_dataset:
    not used; the evaluation asks every held-out prompt once, in file order."""
    drop_last: bool = True
    """An epoch uses only whole batches, leaving out the remainder of the prompts (false: every prompt is
    used and the last batch is completed from the next epoch)."""
    max_length: Optional[int] = None
    """Drop prompts longer than this many tokens: the user message of a text prompt (the text in
    ``prompt_template``, then ``prompt_suffix``), the rendered conversation of a chat prompt."""
    overlong_prompts: Optional[str] = None
    """``drop`` (null: the default) or ``error``: a prompt with no room for an answer within the row limit is
    left out (one warning gives their count and an example) or stops the run, naming it. The row limit is
    the smaller of ``gconfig.max_tokens`` (valid_dataset: ``eval_gconfig.max_tokens``) and the model's
    positions (``max_position_embeddings``); a prompt has no room when its tokens, as the chat template
    renders them, plus one reach past it. Kept prompts are answered in at most ``min(max_new_tokens,
    limit - prompt tokens)`` tokens. valid_dataset: null = train_dataset's."""
    max_rows: Optional[int] = None
    """Use at most this many rows (for builtin:arith: how many problems to generate)."""
    max_pixels: Optional[int] = None
    """Image prompts (TRL's vision layout, docs/vlm.md): an image of more pixels (width x height) is scaled down
    to this many, aspect kept, before the model's processor resizes it by its own rules (null: as the processor
    does; valid_dataset: null = train_dataset's). Fewer pixels give fewer image tokens with Qwen-VL-style
    processors; LLaVA's resize every image to one size."""
    bad_images: Optional[str] = None
    """``error`` (null: the default) or ``skip``: a row whose image is missing or unreadable stops the run before
    any model loads, naming the row and the image, or is left out (one warning gives the count and an example;
    valid_dataset: null = train_dataset's)."""
    prompt_key: Optional[str] = None
    """Column with the prompt: text, or chat messages (a list of ``{role, content}``). null: the first of
    ``prompt``, ``messages``, ``question`` the rows have (valid_dataset: null = train_dataset's)."""
    answer_key: Optional[str] = None
    """Column with the reference answer, given to reward functions as ``answer`` and under its own name too
    (``answer_key=solution``: both ``answer`` and ``solution``). null: ``answer`` when the rows have it, else
    none (valid_dataset: null = train_dataset's). Every other column reaches rewards, workflows and agents
    under its own name."""
    system_prompt: Optional[str] = None
    """System message before every prompt, rendered by the tokenizer's chat template (null: none; a chat
    prompt with its own system message keeps it; valid_dataset: null = train_dataset's, '' = none). It takes
    no placeholders: write literal braces as ``{{`` and ``}}``. A tokenizer whose chat template has no system
    role is reported when the data is built."""
    prompt_template: Optional[str] = None
    """The user message of a text prompt, with ``{question}`` where the row's text goes (null: ``{question}``,
    the text alone; valid_dataset: null = train_dataset's). Literal braces are written ``{{`` and ``}}``.
    Chat prompts are used as they are."""
    prompt_suffix: Optional[str] = None
    """The answer-format instruction, appended verbatim to the user message of a text prompt (null: the task's
    own: ``\\nPlease put your final answer within \\boxed{}.`` for GSM8K-shaped rows (a ``question``
    column) other than builtin:arith, whose warm start teaches ``#### n``; nothing for ``prompt`` rows;
    valid_dataset: null = train_dataset's; '' = none)."""

    def check(self, key: str) -> list[str]:
        if self.type == "sft":
            p = [f"{key}.type: 'sft' datasets (supervised fine-tuning) are not supported here; the trainer does RL "
                 "on prompts (type 'rl'). Its supervised warm start is configured under sft_warmup."]
        else:
            p = one_of(f"{key}.type", self.type, ("rl",))
        p += at_least_one(f"{key}.batch_size", self.batch_size)
        for name in ("max_length", "max_rows"):
            p += at_least_one(f"{key}.{name}", getattr(self, name), nullable=True)
        p += one_of(f"{key}.overlong_prompts", self.overlong_prompts, OVERLONG_PROMPTS)
        p += one_of(f"{key}.bad_images", self.bad_images, BAD_IMAGES)
        p += at_least_one(f"{key}.max_pixels", self.max_pixels, nullable=True)
        return p + self.prompt_problems(key)

    def prompt_problems(self, key: str) -> list[str]:
        """Problems of ``system_prompt`` and ``prompt_template`` (only ``{question}``, in the template)."""
        p = []
        if isinstance(self.prompt_template, str):
            t = self.prompt_template
            fields, err = _placeholders(t)
            if err:
                p.append(f"{key}.prompt_template: got {t!r}, which is not a valid template ({err}); write literal "
                         "braces doubled ({{ and }}) and the placeholder as {question}.")
            elif "question" not in fields:
                p.append(f"{key}.prompt_template: got {t!r}, which has no {{question}} placeholder, so the prompt "
                         f"would not contain the question. Put {{question}} where the question goes, e.g. "
                         f"{key}.prompt_template='Question: {{question}}'.")
            unknown = [f for f in fields if f != "question"]
            if unknown:
                p.append(f"{key}.prompt_template: got {t!r}, with the unknown placeholder{'s' * (len(unknown) > 1)} "
                         f"{', '.join('{' + f + '}' for f in unknown)}; only {{question}} is filled in. Write literal "
                         f"braces doubled ({{{{ and }}}}, e.g. \\boxed{{{{}}}}), or put such text in "
                         f"{key}.prompt_suffix, which is used verbatim.")
        if isinstance(self.system_prompt, str):
            s = self.system_prompt
            fields, err = _placeholders(s)
            if err:
                p.append(f"{key}.system_prompt: got {s!r}, which is not valid ({err}); write literal braces "
                         "doubled ({{ and }}).")
            elif fields:
                p.append(f"{key}.system_prompt: got {s!r}, with the placeholder{'s' * (len(fields) > 1)} "
                         f"{', '.join('{' + f + '}' for f in fields)}; the system prompt takes no placeholders (the "
                         f"question goes in {key}.prompt_template). Write literal braces doubled ({{{{ and }}}}).")
        return p

    def inheriting(self, other: "DatasetConfig") -> "DatasetConfig":
        """A copy whose null column and prompt keys are ``other``'s (valid_dataset reads and asks as
        train_dataset does)."""
        return dataclasses.replace(self, **{n: getattr(other, n) for n in INHERITED_KEYS if getattr(self, n) is None})


INHERITED_KEYS = ("prompt_key", "answer_key", "system_prompt", "prompt_template", "prompt_suffix", "overlong_prompts",
                  "max_pixels", "bad_images")
"""The keys of ``DatasetConfig`` that valid_dataset takes from train_dataset where its own are null."""


def _placeholders(text: str) -> tuple[list[str], str]:
    """The placeholders of a ``str.format`` template as written (``question``, ``foo!r``), and the parse
    error ("" if none); ``{{``/``}}`` are literal braces."""
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as e:
        return [], str(e)
    fields = [name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
              for _, name, spec, conv in parts if name is not None]
    return fields, ""

