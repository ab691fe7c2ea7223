"""Prompts by config: ``system_prompt``, ``prompt_template`` and ``prompt_suffix`` of a dataset section.

The defaults must give exactly the prompts of the versions before these keys existed: the expected
texts and token ids below were computed with that code and are frozen here.
"""

import copy
import json

import pytest

from areal_trainer.components import load, load_config
from areal_trainer.config.base import ConfigError
from areal_trainer.config.schema import DatasetConfig
from areal_trainer.data.datasets import build_samples
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.rollout.workflows.single_turn import prompt_ids

# The first two problems of each built-in split, as the earlier code rendered and tokenized them.
FROZEN_BUILTIN = {
    "train": [
        ("<|im_start|>user\nZoe had 19 pens and found 11 more. How many pens does Zoe have?<|im_end|>\n"
         "<|im_start|>assistant\n",
         [4, 488, 17, 79, 26, 590, 32, 14, 42, 502, 30, 6, 10, 11, 32, 16, 67, 13, 9, 5, 17, 4, 486, 17]),
        ("<|im_start|>user\nLucy has 19 books. Lucy gives 16 books to Tom. How many books does Lucy have left?"
         "<|im_end|>\n<|im_start|>assistant\n",
         [4, 488, 17, 73, 12, 590, 22, 6, 61, 43, 557, 22, 51, 66, 6, 10, 11, 22, 16, 61, 13, 28, 9, 5, 17, 4, 486,
          17]),
    ],
    "test": [
        ("<|im_start|>user\nMia has 12 cookies. Omar has 10 fewer cookies than Mia. How many cookies does Omar "
         "have?<|im_end|>\n<|im_start|>assistant\n",
         [4, 488, 17, 74, 12, 513, 25, 6, 64, 12, 491, 41, 25, 47, 62, 6, 10, 11, 25, 16, 64, 13, 9, 5, 17, 4, 486,
          17]),
        ("<|im_start|>user\nZoe has 13 cookies. Zoe gives 6 cookies to Ben. How many cookies does Zoe have left?"
         "<|im_end|>\n<|im_start|>assistant\n",
         [4, 488, 17, 79, 12, 524, 25, 6, 67, 43, 844, 25, 51, 57, 6, 10, 11, 25, 16, 67, 13, 28, 9, 5, 17, 4, 486,
          17]),
    ],
}
# A GSM8K-format row (braces in the question must stay as they are) and its earlier rendering.
GSM8K_ROW = {"question": "A baker made 48 muffins. How many {muffins} are left?", "answer": "#### 48"}
FROZEN_GSM8K = (
    "<|im_start|>user\nA baker made 48 muffins. How many {muffins} are left?\n"
    "Please put your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n",
    [4, 488, 17, 3, 3, 3, 831, 3, 6, 10, 11, 3, 3, 3, 15, 28, 9, 17, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 6, 5, 17, 4, 486,
     17],
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def render(tok, sample) -> str:
    return tok.apply_chat_template(sample["messages"], add_generation_prompt=True, tokenize=False)


def gsm8k_file(tmp_path) -> str:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps(GSM8K_ROW) + "\n")
    return str(path)


@pytest.mark.parametrize("split", ["train", "test"])
def test_defaults_reproduce_the_builtin_prompts_token_for_token(tok, split):
    samples = build_samples(DatasetConfig(path="builtin:arith", split=split, max_rows=2), tok, "train_dataset")
    for sample, (text, ids) in zip(samples, FROZEN_BUILTIN[split], strict=True):
        assert sample["messages"] == [{"role": "user", "content": sample["prompt"]}]
        assert render(tok, sample) == text
        assert prompt_ids(tok, sample["messages"]) == ids


def test_defaults_reproduce_the_gsm8k_prompt_token_for_token(tok, tmp_path):
    [sample] = build_samples(DatasetConfig(path=gsm8k_file(tmp_path)), tok, "train_dataset")
    assert render(tok, sample) == FROZEN_GSM8K[0]
    assert prompt_ids(tok, sample["messages"]) == FROZEN_GSM8K[1]
    assert sample["prompt"] == GSM8K_ROW["question"] and sample["answer"] == GSM8K_ROW["answer"]


def test_custom_system_prompt_template_and_suffix_are_rendered(tok, tmp_path):
    cfg = DatasetConfig(path=gsm8k_file(tmp_path), system_prompt="Solve it. Braces: {{ok}}",
                        prompt_template="Problem:\n{question}\nThink first.", prompt_suffix=" Answer as \\boxed{n}.")
    [sample] = build_samples(cfg, tok, "train_dataset")
    assert render(tok, sample) == (
        "<|im_start|>system\nSolve it. Braces: {ok}<|im_end|>\n<|im_start|>user\nProblem:\n"
        f"{GSM8K_ROW['question']}\nThink first. Answer as \\boxed{{n}}.<|im_end|>\n<|im_start|>assistant\n")
    assert sample["prompt"] == GSM8K_ROW["question"]  # the row's own question, for the reward and logs


def test_custom_prompt_in_the_builtin_vocabulary_has_no_unknown_tokens(tok):
    cfg = DatasetConfig(path="builtin:arith", max_rows=3, system_prompt="There are 3 apples.",
                        prompt_template="Tom has 2 books. {question}", prompt_suffix="\n####")
    for s in build_samples(cfg, tok, "train_dataset"):
        ids = prompt_ids(tok, s["messages"])
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == render(tok, s)
        assert s["messages"] == [{"role": "system", "content": "There are 3 apples."},
                                 {"role": "user", "content": f"Tom has 2 books. {s['prompt']}\n####"}]


def test_max_length_counts_the_whole_user_message(tok):
    plain = build_samples(DatasetConfig(path="builtin:arith", max_rows=1), tok, "train_dataset")[0]
    n = len(tok(plain["prompt"], add_special_tokens=False).input_ids)
    assert build_samples(DatasetConfig(path="builtin:arith", max_rows=1, max_length=n), tok, "train_dataset")
    with pytest.raises(UserError, match="no usable rows"):
        build_samples(DatasetConfig(path="builtin:arith", max_rows=1, max_length=n, prompt_template="There {question}"),
                      tok, "train_dataset")


def test_empty_system_prompt_and_suffix_mean_none(tok, tmp_path):
    [sample] = build_samples(DatasetConfig(path=gsm8k_file(tmp_path), system_prompt="", prompt_suffix=""), tok, "k")
    assert sample["messages"] == [{"role": "user", "content": GSM8K_ROW["question"]}]


def test_valid_dataset_asks_as_train_dataset_unless_set():
    """The evaluation's dataset takes train_dataset's prompt keys where its own are null (bound at start-up;
    the config itself, and the run's saved config, keep what the user wrote)."""
    built = load("grpo", [])
    for section in (built.config.train_dataset, built.valid_dataset):
        assert (section.system_prompt, section.prompt_template, section.prompt_suffix) == (None, None, None)
    built = load("grpo", ["train_dataset.system_prompt='Be brief.'", "train_dataset.prompt_template='Q: {question}'",
                          "train_dataset.prompt_suffix=' (a number)'"])
    assert (built.valid_dataset.system_prompt, built.valid_dataset.prompt_template,
            built.valid_dataset.prompt_suffix) == ("Be brief.", "Q: {question}", " (a number)")
    assert built.config.valid_dataset.system_prompt is None
    built = load("grpo", ["train_dataset.system_prompt='Be brief.'", "train_dataset.prompt_template='Q: {question}'",
                          "valid_dataset.system_prompt=''", "valid_dataset.prompt_template='{question}?'"])
    assert (built.valid_dataset.system_prompt, built.valid_dataset.prompt_template) == ("", "{question}?")
    assert built.config.train_dataset.system_prompt == "Be brief."


def test_bad_templates_are_all_reported_before_anything_loads():
    with pytest.raises(ConfigError) as e:
        load_config("grpo", ["train_dataset.prompt_template='Solve: {problem}'",
                             "train_dataset.system_prompt='Be {tone}.'",
                             "valid_dataset.prompt_template='Answer this.'"])
    assert e.value.problems == [
        "train_dataset.prompt_template: got 'Solve: {problem}', which has no {question} placeholder, so the prompt "
        "would not contain the question. Put {question} where the question goes, e.g. "
        "train_dataset.prompt_template='Question: {question}'.",
        "train_dataset.prompt_template: got 'Solve: {problem}', with the unknown placeholder {problem}; only "
        "{question} is filled in. Write literal braces doubled ({{ and }}, e.g. \\boxed{{}}), or put such text in "
        "train_dataset.prompt_suffix, which is used verbatim.",
        "train_dataset.system_prompt: got 'Be {tone}.', with the placeholder {tone}; the system prompt takes no "
        "placeholders (the question goes in train_dataset.prompt_template). Write literal braces doubled ({{ and }}).",
        "valid_dataset.prompt_template: got 'Answer this.', which has no {question} placeholder, so the prompt would "
        "not contain the question. Put {question} where the question goes, e.g. "
        "valid_dataset.prompt_template='Question: {question}'.",
    ]


def test_unknown_placeholder_next_to_question_and_unbalanced_braces():
    problems = DatasetConfig(prompt_template="{question} in \\boxed{}",
                             system_prompt="{question}").check("DatasetConfig")
    assert problems == [
        "DatasetConfig.prompt_template: got '{question} in \\\\boxed{}', with the unknown placeholder {}; only "
        "{question} is filled in. Write literal braces doubled ({{ and }}, e.g. \\boxed{{}}), or put such text in "
        "DatasetConfig.prompt_suffix, which is used verbatim.",
        "DatasetConfig.system_prompt: got '{question}', with the placeholder {question}; the system prompt takes no "
        "placeholders (the question goes in DatasetConfig.prompt_template). Write literal braces doubled ({{ and }}).",
    ]
    problems = DatasetConfig(prompt_template="{question} }", system_prompt="a { b").check("DatasetConfig")
    assert problems == [
        "DatasetConfig.prompt_template: got '{question} }', which is not a valid template (Single '}' encountered in "
        "format string); write literal braces doubled ({{ and }}) and the placeholder as {question}.",
        "DatasetConfig.system_prompt: got 'a { b', which is not valid (expected '}' before end of string); write "
        "literal braces doubled ({{ and }}).",
    ]


def without_system_role(tok, template: str):
    other = copy.deepcopy(tok)
    other.chat_template = template
    return other


def test_system_prompt_with_a_template_without_system_role(tok):
    raising = without_system_role(tok, (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"))
    cfg = DatasetConfig(path="builtin:arith", max_rows=2, system_prompt="Be brief.")
    with pytest.raises(UserError) as e:
        build_samples(cfg, raising, "train_dataset")
    assert str(e.value) == (
        "train_dataset.system_prompt: the chat template of the tokenizer fails on a system message (TemplateError: "
        "System role not supported), so the system prompt 'Be brief.' cannot reach the model. Put the instruction in "
        "train_dataset.prompt_template instead (e.g. train_dataset.prompt_template='<instruction> {question}') and "
        "set train_dataset.system_prompt=null, or use a tokenizer whose chat template has a system role.")
    dropping = without_system_role(tok, (
        "{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endif %}{% endfor %}"))
    with pytest.raises(UserError, match=r"valid_dataset.system_prompt: the chat template of the tokenizer leaves a "
                                        r"system message out, .* set valid_dataset.system_prompt='', or"):
        build_samples(cfg, dropping, "valid_dataset")
    assert build_samples(DatasetConfig(path="builtin:arith", max_rows=2), raising, "train_dataset")  # no system prompt
