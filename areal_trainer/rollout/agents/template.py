"""How a session turns a chat request into prompt ids: ``rollout.chat_template_type`` (AReaL's key).

* ``hf`` (default): every call's messages and tools are rendered by the tokenizer's chat template and
  tokenized as one text, as a Hugging Face server does.
* ``concat``: a call whose messages extend an earlier call of its episode (that call's messages, then
  one of its answers as an ``assistant`` message, then any new messages, with the same tools) is that
  call's exact ids (its prompt ids and the answer's sampled ids, stop token included) followed by the
  template's tokens for the new messages only: the *segment* after the answer. Nothing the model
  already saw or wrote is rendered again, so every call of a conversation extends the previous one
  token for token and ``rollout.agent_export=concat`` keeps it in one row. A call that extends no
  earlier call (the episode's first, an agent that edits its history, other tools) is rendered as in
  ``hf``; after the first such calls are counted (``agent/chat_template_fallbacks``).

The segment. The template renders the conversation with a placeholder in place of the answer (its
content; its tool calls are part of the sampled ids) and the generation prompt; the segment is the
text after the placeholder (the end of the assistant turn, the new messages, the next assistant
turn's opening), tokenized on its own. When the answer ends with the token the segment starts with
(the template's end-of-turn token is the tokenizer's EOS, as with Qwen's ``<|im_end|>``), that token
is dropped from the segment, so the ids are the template's rendering of the whole conversation. When
the model stopped with another token (the built-in tokenizer stops with ``<eos>`` and closes turns with
``<|im_end|>``), the ids keep the model's stop token after the answer and then the template's end of
turn. A truncated answer (no stop token) is followed by the whole segment. A template that does not
render the placeholder verbatim exactly once has no segment: the call is rendered as in ``hf``.

A :class:`Renderer` renders and tokenizes each distinct conversation once for all the sessions of a rollout
call that share it (a prompt's episodes all start from the same messages, and hear the same feedback).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...model.chat import unknown_pieces

CHAT_TEMPLATE_TYPES = ("hf", "concat")
PLACEHOLDER = "\x00assistant-answer\x00"
"""Stands in for an answer's content when the template renders the text that follows an answer."""


def render_text(tokenizer, messages: list[dict], tools: list[dict]) -> str:
    """The template's text of ``messages`` (and ``tools``) with the generation prompt."""
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)


def segment_text(tokenizer, before: list[dict], after: list[dict], tools: list[dict]) -> str | None:
    """The template's text between an answer's content and the next assistant turn's content, when the
    answer follows ``before`` and ``after`` follows it; None when the template does not render an answer's
    content verbatim exactly once (or cannot render the conversation without the answer's tool calls)."""
    conversation = [*before, {"role": "assistant", "content": PLACEHOLDER}, *after]
    try:
        text = render_text(tokenizer, conversation, tools)
    except Exception:  # noqa: BLE001 - e.g. a template that wants the answer's tool calls before a tool message
        return None
    if text.count(PLACEHOLDER) != 1:
        return None
    return text[text.index(PLACEHOLDER) + len(PLACEHOLDER):]


def joined(segment: list[int], output_ids: list[int], truncated: bool) -> list[int]:
    """The segment's ids to put after an answer's ids, without repeating the end-of-turn token it ends with."""
    if not truncated and output_ids and segment and output_ids[-1] == segment[0]:
        return segment[1:]
    return segment


def _calls(message: Any) -> list[tuple[str, Any]]:
    """An assistant message's tool calls as (name, arguments) pairs, the arguments decoded when they are JSON."""
    out = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function", {}) if isinstance(c, dict) else c.function
        name = fn.get("name") if isinstance(fn, dict) else fn.name
        args = fn.get("arguments") if isinstance(fn, dict) else fn.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except json.JSONDecodeError:
                pass
        out.append((name, args))
    return out


class Renderer:
    """The template's renders and their ids, each distinct one made once (shared by a rollout call's sessions).
    What it returns is shared too: callers copy before they change it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._memo: dict[str, Any] = {}

    def _once(self, key: tuple, make):
        k = json.dumps(key, sort_keys=True, default=repr)
        if k not in self._memo:
            self._memo[k] = make()  # a render that raises is not kept: it raises again
        return self._memo[k]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def whole(self, messages: list[dict], tools: list[dict]) -> tuple[list[int], str]:
        """The ids and text of ``messages`` and ``tools`` rendered whole with the generation prompt (``hf``)."""
        def make():
            text = render_text(self.tokenizer, messages, tools)
            return self.ids(text), text
        return self._once(("whole", messages, tools), make)

    def segment(self, before: list[dict], after: list[dict], tools: list[dict]) -> tuple[list[int], str] | None:
        """The ids and text of :func:`segment_text` (None: the template has no segment)."""
        def make():
            text = segment_text(self.tokenizer, before, after, tools)
            return None if text is None else (self.ids(text), text)
        return self._once(("segment", before, after, tools), make)

    def unknown_words(self, text: str) -> list[str]:
        """The words of ``text`` that the tokenizer cannot spell (``model/chat.py::unknown_pieces``)."""
        return self._once(("unknown", text), lambda: unknown_pieces(self.tokenizer, text))


@dataclass
class Answer:
    """One answer of a call: what the agent got back (to recognise it in a later call's messages) and the
    ids it was sampled as."""

    content: str
    tool_calls: list[tuple[str, Any]]
    output_ids: list[int]
    truncated: bool

    def is_message(self, message: dict) -> bool:
        """Whether an ``assistant`` message of a request is this answer, as the agent got it back."""
        return (message.get("role") == "assistant" and (message.get("content") or "") == self.content
                and _calls(message) == self.tool_calls)


@dataclass
class RenderedCall:
    """A call of an episode as ``concat`` continues it: its messages and tools, prompt ids and answers."""

    messages: list[dict]
    tools: list[dict]
    prompt_ids: list[int]
    answers: list[Answer] = field(default_factory=list)

    def add_answer(self, content: str | None, tool_calls: Any, output_ids: list[int], truncated: bool) -> None:
        calls = _calls({"tool_calls": [{"function": {"name": c.function.name, "arguments": c.function.arguments}}
                                       for c in tool_calls or []]})
        self.answers.append(Answer(content or "", calls, list(output_ids), bool(truncated)))


@dataclass
class Extension:
    """A call that extends an earlier one: its prompt ids, and the segment's text and ids."""

    prompt_ids: list[int]
    text: str
    segment_ids: list[int]


def extend(renderer: Renderer, calls: list[RenderedCall], messages: list[dict], tools: list[dict]
           ) -> Extension | None:
    """The ``concat`` prompt of a call with ``messages`` and ``tools``: the newest earlier call it extends
    (with one of that call's answers next), continued by the segment; None when it extends none (or the
    template has no segment)."""
    for call in reversed(calls):
        n = len(call.messages)
        if len(messages) <= n or call.tools != tools or messages[:n] != call.messages:
            continue
        answer = next((a for a in call.answers if a.is_message(messages[n])), None)
        if answer is None:
            continue
        found = renderer.segment(call.messages, messages[n + 1:], tools)
        if found is None:
            return None
        segment, text = found
        ids = call.prompt_ids + answer.output_ids + joined(segment, answer.output_ids, answer.truncated)
        return Extension(ids, text, segment)
    return None
