"""The tool-calling built-in variants (``builtin:<size>-tools``): the default tokenizer and models are
untouched, the extra tokens come after every default id, the template renders tools, hermes calls and
tool results so that the calls read back and re-render to the same ids, and the warm start trains the
teacher's calculator conversations on their assistant turns only. The calculator example's tool and agent
(``examples/agents/calculator``) on a scripted engine: one concatenated row per episode."""

from __future__ import annotations

import types

import pytest
import torch

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.data import arith
from areal_trainer.errors import UserError
from areal_trainer.failures import FailurePolicy
from areal_trainer.model import builtin
from areal_trainer.model.chat import template_message
from areal_trainer.model.load import load_causal_lm, load_positions, load_tokenizer
from areal_trainer.rollout.agents.spec import load_agent
from areal_trainer.rollout.agents.tool_parsers import get_parser
from areal_trainer.rollout.agents.tools import tool_from_function
from areal_trainer.rollout.agents.workflow import AgentWorkflow
from areal_trainer.rollout.types import Generation
from areal_trainer.train.sft import sft_batch, with_tool_demonstrations
from examples.agents.calculator.agent import calc

QUESTION = "Tom has 12 apples. Tom gives 5 apples to Anna. How many apples does Tom have left?"


@pytest.fixture(scope="module")
def tok():
    return builtin.build_tokenizer("builtin:tiny-tools")


def _ids(tok, messages, *, tools=None, opening=False):
    text = tok.apply_chat_template([template_message(m) for m in messages], tools=tools,
                                   add_generation_prompt=opening, tokenize=False)
    return tok(text, add_special_tokens=False).input_ids


def _conversation(expression="12 - 5", value="7"):
    user = {"role": "user", "content": QUESTION}
    return [user, *arith.tool_demonstration(f"{expression} = {value}\n#### {value}")]


def test_default_tokenizer_is_unchanged_and_the_variant_appends_tokens(tok):
    plain = builtin.build_tokenizer()
    assert builtin.build_tokenizer("builtin:tiny").get_vocab() == plain.get_vocab()
    assert (plain.eos_token, plain.chat_template) == ("<eos>", builtin.CHAT_TEMPLATE)
    extra = {w: i for w, i in tok.get_vocab().items() if w not in plain.get_vocab()}
    assert all(tok.get_vocab()[w] == i for w, i in plain.get_vocab().items())
    assert sorted(extra.values()) == list(range(len(plain), len(tok)))
    assert set(extra) == set(builtin.TOOL_PIECES + builtin.TOOL_TAGS)
    assert tok.eos_token == "<|im_end|>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "#### 7"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == plain.apply_chat_template(messages, tokenize=False)  # without tools, the default rendering


def test_a_number_is_the_same_token_after_a_space_a_quote_or_a_newline(tok):
    ids = tok('Tom has 19 "19 + 19"\n19', add_special_tokens=False).input_ids
    assert tok.convert_ids_to_tokens(ids) == ["Tom", "▁has", "▁", "19", '▁"', "19", "▁+", "▁", "19", '"', "\n", "19"]
    assert builtin.build_tokenizer()("Tom has 19", add_special_tokens=False).input_ids[2] == \
        builtin.build_tokenizer().convert_tokens_to_ids("▁19")  # the default keeps "▁19"


def test_paths_sizes_and_errors():
    assert builtin.has_tools("builtin:small-tools") and not builtin.has_tools("builtin:small")
    assert builtin.builtin_size("builtin:small-tools") == "small"
    with pytest.raises(ValueError, match="builtin:tiny, builtin:small, builtin:tiny-tools, builtin:small-tools"):
        builtin.builtin_size("builtin:huge-tools")
    tok = load_tokenizer("builtin:tiny-tools")
    model = load_causal_lm("builtin:tiny-tools", tokenizer=tok, dtype="float32", device=torch.device("cpu"), seed=0)
    assert model.config.vocab_size == len(tok) and model.config.eos_token_id == tok.eos_token_id
    assert load_positions("builtin:tiny-tools", tokenizer=tok).count == 512
    with pytest.raises(UserError, match="unknown built-in model 'builtin:huge-tools'"):
        load_causal_lm("builtin:huge-tools", tokenizer=tok, dtype="float32", device=torch.device("cpu"), seed=0)


def test_a_rendered_call_reads_back_and_re_renders_to_the_same_ids(tok):
    """The assistant's tokens of a rendered conversation, decoded as the agent client decodes a sampled
    answer, give back the call; the conversation continued with the parsed message has the same ids
    (what ``rollout.agent_export=concat`` needs)."""
    conversation = _conversation()
    tools = [arith.CALC_TOOL]
    prompt = _ids(tok, conversation[:1], tools=tools, opening=True)
    full = _ids(tok, conversation, tools=tools)
    assert full[:len(prompt)] == prompt and tok.unk_token_id not in full
    answer = full[len(prompt):]
    answer = answer[:answer.index(tok.eos_token_id) + 1]  # a sampled answer ends with its EOS
    parsed = get_parser("hermes").parse(tok.decode(answer, skip_special_tokens=True))
    assert parsed.failed == 0 and parsed.content is None
    [call] = parsed.tool_calls
    assert (call.name, call.arguments) == ("calc", '{"expression": "12 - 5"}')
    replayed = [conversation[0], {"role": "assistant", "content": parsed.content, "tool_calls": [call.to_openai()]},
                {"role": "tool", "tool_call_id": call.id, "name": "calc", "content": "7"}]
    again = _ids(tok, replayed, tools=tools, opening=True)
    assert again[:len(prompt) + len(answer)] == prompt + answer
    assert tok.decode(again[len(prompt) + len(answer):]) == "\n<|im_start|>user\n<tool_response>\n7\n" \
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert again == _ids(tok, conversation[:3], tools=tools, opening=True)


def test_the_variant_saves_and_loads_like_a_checkpoint(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    conversation = _conversation()
    assert _ids(loaded, conversation, tools=[arith.CALC_TOOL]) == _ids(tok, conversation, tools=[arith.CALC_TOOL])
    assert (loaded.eos_token_id, len(loaded)) == (tok.eos_token_id, len(tok))


def test_tools_render_names_and_argument_types_only(tok):
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                                   tools=[arith.CALC_TOOL], add_generation_prompt=True, tokenize=False)
    assert text.startswith('<|im_start|>system\nBe brief.\n<tools>\n{"name": "calc", "arguments": '
                           '{"expression": "string"}}\n</tools><|im_end|>\n<|im_start|>user\nhi<|im_end|>')


def test_tool_warm_start_rows_train_the_assistant_turns_of_the_teacher(tok):
    rows = arith.generate("train", 64)
    samples = [{"messages": [{"role": "user", "content": r["question"]}], "prompt": r["question"],
                "answer": r["answer"], "fields": {"demonstration": r["demonstration"]}, "row": f"row {i}"}
               for i, r in enumerate(rows)]
    demos = with_tool_demonstrations(samples)
    wrong = 0
    for r, s in zip(rows, demos):
        expression = s["fields"]["demonstration_messages"][0]["tool_calls"][0]["function"]["arguments"]["expression"]
        assert r["demonstration"].startswith(f"{expression} = ")  # the teacher's own expression
        wrong += r["demonstration"] != r["answer"]
    assert wrong > 0  # the teacher's subtraction errors are there
    batch = sft_batch(demos[:1], tok)
    ids = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    trained = [t for t, m in zip(ids, batch["loss_mask"][0].tolist()) if m]
    value = rows[0]["demonstration"].split("#### ")[1]
    calc = '{"name": "calc", "arguments": {"expression": "' + rows[0]["demonstration"].split(" = ")[0] + '"}}'
    assert tok.decode(trained) == f"<tool_call>\n{calc}\n</tool_call><|im_end|>#### {value}<|im_end|>"
    assert ids[-1] == tok.eos_token_id  # nothing after the last assistant turn
    plain = sft_batch(samples[:1], tok)  # rows without a conversation: prompt + text demonstration, as before
    assert tok.decode(plain["input_ids"][0][plain["loss_mask"][0].bool()]) == rows[0]["demonstration"] + "<|im_end|>"


def test_bad_demonstration_messages_are_one_clear_error(tok):
    sample = {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "answer": "1", "row": "row 3 of x",
              "fields": {"demonstration_messages": [{"role": "tool", "content": "1"}]}}
    with pytest.raises(UserError, match="row 3 of x: 'demonstration_messages' must be a list of chat messages"):
        sft_batch([sample], tok)


@pytest.mark.parametrize("expression, value", [("3 + 4", "7"), ("12 - 5", "7"), ("-3 * 4", "-12"), ("8 / 2", "4"),
                                               ("(1 + 2) * 3", "9")])
def test_calc_evaluates_integer_arithmetic(expression, value):
    assert calc(expression) == value


@pytest.mark.parametrize("expression", ["7 / 2", "1 / 0", "2 ** 3", "1.5 + 1", "True + 1", "x + 1",
                                        "__import__('os')", "1 +", "9" * 201])
def test_calc_refuses_everything_else(expression):
    with pytest.raises((ValueError, SyntaxError)):
        calc(expression)


def test_the_agents_calc_renders_as_the_warm_starts_tool(tok):
    messages = [{"role": "user", "content": QUESTION}]
    assert _ids(tok, messages, tools=[tool_from_function(calc).to_openai()]) == \
        _ids(tok, messages, tools=[arith.CALC_TOOL])


class Teacher:
    """Answers as the warm start's teacher does: a calc call on a prompt without a tool result, else
    ``#### <the tool's value>`` (each with the end-of-sequence token)."""

    max_positions = None

    def __init__(self, tok, expression):
        self.tok, self.expression = tok, expression

    def generate(self, prompts, gconfig):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            if "<tool_response>" in text:
                reply = f"#### {text.rsplit('<tool_response>', 1)[1].split()[0]}"
            else:
                reply = get_parser("hermes").format_call("calc", {"expression": self.expression})
            ids = self.tok(reply, add_special_tokens=False).input_ids + [self.tok.eos_token_id]
            out.append(Generation(ids, [-0.5] * len(ids), False, [0] * len(ids)))
        return out


@pytest.mark.parametrize("expression, reward", [("12 - 5", 1.0), ("12 + 5", 0.0)])
def test_calculator_episodes_concatenate_into_one_row_each(tok, expression, reward):
    spec = load_agent("examples.agents.calculator.agent.run", {})
    wf = AgentWorkflow(engine=Teacher(tok, expression), tokenizer=tok, agent=spec, export="concat",
                       reward=types.SimpleNamespace(), failures=FailurePolicy.of(error_value=-1.0))
    sample = {"messages": [{"role": "user", "content": QUESTION}], "prompt": QUESTION, "answer": "12 - 5 = 7\n#### 7",
              "fields": {}}
    [group] = wf.rollout([sample], GenerationHyperparameters(n_samples=2, max_new_tokens=40))
    stats = {k: v.value for k, v in group.stats.items()}
    assert (stats["agent/calls"], stats["agent/tool_calls"], stats["agent/concat_fallbacks"]) == (4, 2, 0)
    assert group["input_ids"].shape[0] == 2 and group.episode_rewards == (reward, reward)
    row = group["input_ids"][0][group["attention_mask"][0].bool()].tolist()
    value = calc(expression)
    whole = _ids(tok, [sample["messages"][0], *arith.tool_demonstration(f"{expression} = {value}")],
                 tools=[arith.CALC_TOOL])
    assert row == whole[:-1]  # all but the newline after the last turn
    assert tok.decode(row).endswith(f"<tool_response>\n{value}\n</tool_response><|im_end|>\n"
                                    f"<|im_start|>assistant\n#### {value}<|im_end|>")
