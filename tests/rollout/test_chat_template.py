"""``rollout.chat_template_type`` (``rollout/agents/template.py``): with ``concat`` a call that extends an earlier
one is that call's exact ids plus the template's tokens for the new messages only, so ``agent_export=concat``
keeps the conversation in one row without falling back; a call that extends none is rendered whole, as with
``hf``, and counted."""

from __future__ import annotations

import types

import pytest

from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.errors import UserError
from areal_trainer.failures import FailurePolicy
from areal_trainer.model.builtin import build_tokenizer
from areal_trainer.model.chat import prompt_ids
from areal_trainer.rollout.agents.spec import load_agent
from areal_trainer.rollout.agents.template import joined, segment_text
from areal_trainer.rollout.agents.workflow import AgentWorkflow
from areal_trainer.rollout.types import Generation

REWARD = types.SimpleNamespace()  # agents score through the failure policy
FAILURES = FailurePolicy.of(error_value=-1.0, max_error_fraction=0.5)
QUESTION = {"role": "user", "content": "Tom has 3 apples. How many apples does Tom have?"}
AGAIN = {"role": "user", "content": "again"}


class Scripted:
    """Answers call ``k`` with ``texts[k]`` (the last one after that), each choice its own text when a list;
    the stop token follows unless the answer is in ``cut``. Keeps every prompt it got."""

    max_positions = None

    def __init__(self, tok, texts, cut=(), stop=None):
        self.tok, self.texts, self.cut, self.prompts = tok, texts, set(cut), []
        self.stop = tok.eos_token_id if stop is None else stop

    def generate(self, prompts, gconfig):
        out = []
        for p in prompts:
            k = len(self.prompts)
            self.prompts.append(list(p))
            text = self.texts[min(k, len(self.texts) - 1)]
            ids = self.tok(text, add_special_tokens=False).input_ids + ([] if k in self.cut else [self.stop])
            out.append(Generation(ids, [-0.5] * len(ids), k in self.cut, [0] * len(ids)))
        return out


def _rollout(tok, engine, agent: str, template: str, kwargs=None, n_samples: int = 1):
    wf = AgentWorkflow(engine=engine, tokenizer=tok, reward=REWARD, agent=load_agent(agent, kwargs or {}),
                       export="concat", chat_template_type=template, failures=FAILURES)
    try:
        [group] = wf.rollout([{"messages": [QUESTION], "prompt": "p", "answer": "#### 3"}],
                             GenerationHyperparameters(n_samples=n_samples, max_new_tokens=64))
    finally:
        wf.close()
    return group


async def turns(data, *, client, n: int = 3, edit: bool = False):
    """``n`` calls, each answer and "again" appended; ``edit``: the second call rewrites the question."""
    messages = list(data["messages"])
    for k in range(n):
        if edit and k == 1:
            messages[0] = {"role": "user", "content": "Tom has 4 apples. How many apples does Tom have?"}
        r = await client.chat.completions.create(model="m", messages=messages)
        messages += [{"role": "assistant", "content": r.choices[0].message.content}, AGAIN]
    return 1.0


def _ids(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def _segment(tok, before):
    return _ids(tok, segment_text(tok, before, [AGAIN], []))


def test_hf_rerenders_and_falls_back_concat_continues_the_sampled_ids(tok):
    """The built-in tokenizer stops with <eos> and closes turns with <|im_end|>: ``hf`` renders the history
    without the <eos>, so no call extends the last and each is a row; ``concat`` keeps the <eos> and merges."""
    engine = Scripted(tok, ["3 - 4 = 1", "#### 2", "#### 3"])
    hf = _rollout(tok, engine, "tests.rollout.test_chat_template.turns", "hf")
    assert hf.n_rows == 3 and hf.stats["agent/concat_fallbacks"].value == 2
    assert hf.stats["agent/chat_template_fallbacks"].value == 0  # hf renders every call whole: nothing to count
    engine = Scripted(tok, ["3 - 4 = 1", "#### 2", "#### 3"])
    group = _rollout(tok, engine, "tests.rollout.test_chat_template.turns", "concat")
    assert group.n_rows == 1 and group.stats["agent/concat_fallbacks"].value == 0
    assert group.stats["agent/chat_template_fallbacks"].value == 0
    p0, p1, p2 = engine.prompts
    a0, a1 = _ids(tok, "3 - 4 = 1") + [tok.eos_token_id], _ids(tok, "#### 2") + [tok.eos_token_id]
    history = [QUESTION, {"role": "assistant", "content": "3 - 4 = 1"}, AGAIN]
    assert p0 == prompt_ids(tok, [QUESTION])
    assert p1 == p0 + a0 + _segment(tok, [QUESTION])  # <eos> kept, then the template's <|im_end|>
    assert p2 == p1 + a1 + _segment(tok, history)
    assert tok.decode(p1[len(p0) + len(a0):])[:len("<|im_end|>")] == "<|im_end|>"
    row = group["input_ids"][0, :int(group["attention_mask"][0].sum())].tolist()
    assert row == p2 + _ids(tok, "#### 3") + [tok.eos_token_id]
    assert group["turn_ids"][0].max() == 2 and group["num_turns"].tolist() == [3.0]


def test_an_answer_ending_with_the_end_of_turn_token_is_not_repeated():
    """EOS = the template's end of turn (ChatML, Qwen): concat ids are the template's rendering exactly; a cut
    answer (no stop token) gets the whole segment."""
    chatml = build_tokenizer()
    chatml.eos_token = "<|im_end|>"
    engine = Scripted(chatml, ["3 - 4 = 1", "#### 2", "#### 3"])
    _rollout(chatml, engine, "tests.rollout.test_chat_template.turns", "concat")
    history = [QUESTION, {"role": "assistant", "content": "3 - 4 = 1"}, AGAIN,
               {"role": "assistant", "content": "#### 2"}, AGAIN]
    assert engine.prompts[2] == prompt_ids(chatml, history)  # as hf would render it
    segment = _segment(chatml, [QUESTION])
    assert segment[0] == chatml.eos_token_id
    assert joined(segment, [7, chatml.eos_token_id], truncated=False) == segment[1:]
    assert joined(segment, [7, chatml.eos_token_id], truncated=True) == segment
    engine = Scripted(chatml, ["3 - 4 =", "#### 3"], cut={0})
    group = _rollout(chatml, engine, "tests.rollout.test_chat_template.turns", "concat", {"n": 2})
    assert engine.prompts[1] == engine.prompts[0] + _ids(chatml, "3 - 4 =") + segment
    assert group.n_rows == 1


def test_a_call_that_extends_no_earlier_call_is_rendered_whole_and_counted(tok):
    engine = Scripted(tok, ["3 - 4 = 1", "#### 2", "#### 3"])
    group = _rollout(tok, engine, "tests.rollout.test_chat_template.turns", "concat", {"edit": True})
    assert group.stats["agent/chat_template_fallbacks"].value == 1  # the edited call; the third extends it
    edited = [{"role": "user", "content": "Tom has 4 apples. How many apples does Tom have?"},
              {"role": "assistant", "content": "3 - 4 = 1"}, AGAIN]
    assert engine.prompts[1] == prompt_ids(tok, edited)
    assert engine.prompts[2][:len(engine.prompts[1])] == engine.prompts[1]
    assert group.n_rows == 2 and group.stats["agent/concat_fallbacks"].value == 1


async def second_choice(data, *, client):
    """Two choices; the conversation goes on from the second."""
    messages = list(data["messages"])
    r = await client.chat.completions.create(model="m", messages=messages, n=2)
    messages += [{"role": "assistant", "content": r.choices[1].message.content}, AGAIN]
    await client.chat.completions.create(model="m", messages=messages)
    return 1.0


def test_the_continued_choice_is_the_one_the_agent_sent_back(tok):
    engine = Scripted(tok, ["#### 1", "#### 2", "#### 3"])
    group = _rollout(tok, engine, "tests.rollout.test_chat_template.second_choice", "concat")
    p0 = engine.prompts[0]
    assert engine.prompts[2] == p0 + _ids(tok, "#### 2") + [tok.eos_token_id] + _segment(tok, [QUESTION])
    assert group.n_rows == 2 and group.stats["agent/concat_fallbacks"].value == 0  # the first choice: its own row
    assert group.stats["agent/chat_template_fallbacks"].value == 0


CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "3 + 4"}}\n</tool_call>'


async def with_tool(data, *, client):
    from examples.agents.calculator.agent import calc

    messages = list(data["messages"])
    r = await client.chat.completions.create(model="m", messages=messages, tools=[calc])
    message = r.choices[0].message
    messages.append(message)
    messages += [await client.call_tool(c, [calc]) for c in message.tool_calls]
    await client.chat.completions.create(model="m", messages=messages, tools=[calc])
    return 1.0


def test_a_tool_call_and_its_result_continue_the_sampled_call():
    """The answer's tool call is part of its sampled ids: only the tool's message is rendered after it."""
    tok = build_tokenizer("builtin:tiny-tools")  # stops with <|im_end|>, the template's end of turn
    engine = Scripted(tok, [CALL, "#### 7"])
    group = _rollout(tok, engine, "tests.rollout.test_chat_template.with_tool", "concat")
    p0, p1 = engine.prompts
    answer = _ids(tok, CALL) + [tok.eos_token_id]
    assert p1[:len(p0) + len(answer)] == p0 + answer
    assert "<tool_response>\n7\n</tool_response>" in tok.decode(p1[len(p0) + len(answer):])
    assert group.n_rows == 1 and group.stats["agent/chat_template_fallbacks"].value == 0
    hf = _rollout(tok, Scripted(tok, [CALL, "#### 7"]), "tests.rollout.test_chat_template.with_tool", "hf")
    assert hf.n_rows == 1  # this template re-renders the call as sampled: hf merges too


def test_a_template_that_does_not_render_an_answer_verbatim_has_no_segment(tok):
    tok = build_tokenizer()
    tok.chat_template = tok.chat_template.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    engine = Scripted(tok, ["3 - 4 = 1", "#### 3"])
    assert segment_text(tok, [QUESTION], [AGAIN], []) is not None  # the placeholder has no spaces to trim
    tok.chat_template = tok.chat_template.replace("| trim", "| upper")
    assert segment_text(tok, [QUESTION], [AGAIN], []) is None
    group = _rollout(tok, engine, "tests.rollout.test_chat_template.turns", "concat", {"n": 2})
    assert group.stats["agent/chat_template_fallbacks"].value == 1


def test_an_unknown_chat_template_type_is_refused(tok):
    with pytest.raises(UserError, match="rollout.chat_template_type: got 'jinja'"):
        AgentWorkflow(engine=None, tokenizer=tok, reward=REWARD, agent=load_agent(
            "tests.rollout.test_chat_template.turns", {}), chat_template_type="jinja")
