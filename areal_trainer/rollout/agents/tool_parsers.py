"""Tool-call parsers: read the calls a model wrote into its text as OpenAI-style ``ToolCall`` objects.

Each model family writes calls its own way, so the parser is chosen by name
(``rollout.tool_call_parser``) from ``TOOL_CALL_PARSERS``, or given as an import path (a class with
``parse`` and ``format_call``). ``parse`` splits sampled text into content and calls;
``format_call`` writes a call the way the model would, for demonstrations. A call that cannot be
read is not an error: its text stays in the content and ``ParsedOutput.failed`` counts it, because a
malformed call is something the policy did and should be trained away, not a crash.

Kept apart from :mod:`areal_trainer.rollout.agents.tools` (the tools themselves: schemas and running them)
because the two change for different reasons: a new model family means a new parser here, a new
kind of tool means a change there.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from areal_trainer.errors import one_of
from areal_trainer.plugins import PluginError, import_object


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One call, shaped like OpenAI's: ``arguments`` is a JSON string of an object."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedOutput:
    """The text outside calls (stripped; None if empty), the calls, and how many could not be read."""

    content: str | None
    tool_calls: list[ToolCall]
    failed: int


@runtime_checkable
class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedOutput: ...

    def format_call(self, name: str, arguments: str | dict[str, Any]) -> str: ...


def _args_dict(arguments: str | dict[str, Any]) -> dict[str, Any]:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(value, dict):
        raise ValueError(f"tool-call arguments must be a JSON object, got {arguments!r}.")
    return value


def _to_call(obj: Any, args_keys: tuple[str, ...]) -> ToolCall | None:
    """A ToolCall from a decoded ``{"name": ..., <args key>: {...}}``, or None if malformed.
    A missing arguments key means no arguments (models often leave it out for such tools)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if not isinstance(args, dict):
        return None
    return ToolCall(name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


def _decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at ``pos`` (after whitespace) and the index after it, or None."""
    start = len(text) - len(text[pos:].lstrip())
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError:
        return None


def _finish(kept: list[str], calls: list[ToolCall], failed: int) -> ParsedOutput:
    content = "".join(kept).strip()
    return ParsedOutput(content or None, calls, failed)


class HermesParser:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks, one per call:
    Qwen2.5, Qwen3, QwQ and NousHermes 2/3 chat templates. The JSON is decoded rather than cut at
    the first closing tag, so a ``</tool_call>`` inside an argument string does not break it; an
    unclosed block at the very end (the model stopped there) is accepted if its JSON is whole."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def parse(self, text: str) -> ParsedOutput:
        kept, calls, failed, pos = [], [], 0, 0
        while (start := text.find(self.OPEN, pos)) != -1:
            kept.append(text[pos:start])
            body = start + len(self.OPEN)
            decoded = _decode_at(text, body)
            call = _to_call(decoded[0], ("arguments",)) if decoded else None
            rest = text[decoded[1]:] if decoded else ""
            if call and (rest.lstrip().startswith(self.CLOSE) or not rest.strip()):
                calls.append(call)
                pos = len(text) - len(rest.lstrip()) + (len(self.CLOSE) if rest.strip() else 0)
                continue
            failed += 1
            close = text.find(self.CLOSE, body)
            pos = len(text) if close == -1 else close + len(self.CLOSE)
            kept.append(text[start:pos])
        kept.append(text[pos:])
        return _finish(kept, calls, failed)

    def format_call(self, name: str, arguments: str | dict[str, Any]) -> str:
        payload = json.dumps({"name": name, "arguments": _args_dict(arguments)}, ensure_ascii=False)
        return f"{self.OPEN}\n{payload}\n{self.CLOSE}"


class MistralParser:
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``: Mistral-7B-Instruct v0.3, Mistral
    NeMo, Mistral Small/Large 2 (the v3 tokenizers' format; later v11+ models write
    ``[TOOL_CALLS]name[ARGS]{...}`` instead, which this parser does not read). Each
    ``[TOOL_CALLS]`` array is one unit: if any call in it is malformed, the whole array stays in
    the content and counts as one failure."""

    TAG = "[TOOL_CALLS]"

    def parse(self, text: str) -> ParsedOutput:
        kept, calls, failed, pos = [], [], 0, 0
        while (start := text.find(self.TAG, pos)) != -1:
            kept.append(text[pos:start])
            decoded = _decode_at(text, start + len(self.TAG))
            items = decoded[0] if decoded else None
            items = [items] if isinstance(items, dict) else items
            found = [_to_call(x, ("arguments",)) for x in items] if isinstance(items, list) else [None]
            if found and all(found):
                calls.extend(found)
                pos = decoded[1]
                continue
            failed += 1
            nxt = text.find(self.TAG, start + len(self.TAG))
            pos = decoded[1] if decoded else (len(text) if nxt == -1 else nxt)
            kept.append(text[start:pos])
        kept.append(text[pos:])
        return _finish(kept, calls, failed)

    def format_call(self, name: str, arguments: str | dict[str, Any]) -> str:
        payload = json.dumps([{"name": name, "arguments": _args_dict(arguments)}], ensure_ascii=False)
        return self.TAG + payload


class Llama3JsonParser:
    """Llama 3.1 / 3.2 / 3.3 JSON tool calling: the whole message is ``{"name": ..., "parameters":
    {...}}`` (``"arguments"`` is accepted too), optionally after ``<|python_tag|>``; several calls
    are separated by ``;``. A message that does not start with ``{`` is plain content. One that
    does but is not entirely well-formed calls stays content and counts as one failure."""

    PREFIX = "<|python_tag|>"

    def parse(self, text: str) -> ParsedOutput:
        body = text.strip().removeprefix(self.PREFIX).lstrip()
        if not body.startswith("{"):
            return _finish([text], [], 0)
        calls, pos = [], 0
        while pos < len(body):
            decoded = _decode_at(body, pos)
            call = _to_call(decoded[0], ("parameters", "arguments")) if decoded else None
            if call is None:
                return _finish([text], [], 1)
            calls.append(call)
            pos = decoded[1]
            rest = body[pos:].lstrip()
            pos = len(body) - len(rest.removeprefix(";").lstrip())
            if rest and not rest.startswith(";"):
                return _finish([text], [], 1)
        return ParsedOutput(None, calls, 0)

    def format_call(self, name: str, arguments: str | dict[str, Any]) -> str:
        return json.dumps({"name": name, "parameters": _args_dict(arguments)}, ensure_ascii=False)


TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "hermes": HermesParser(),
    "mistral": MistralParser(),
    "llama3_json": Llama3JsonParser(),
}


def get_parser(name: str, key: str = "rollout.tool_call_parser") -> ToolCallParser:
    """The registered parser ``name``, or one given as an import path (a class is instantiated)."""
    if isinstance(name, str) and name in TOOL_CALL_PARSERS:
        return TOOL_CALL_PARSERS[name]
    if not isinstance(name, str) or "." not in name:
        problem = one_of(key, name, sorted(TOOL_CALL_PARSERS),
                         fix="Or give the import path of your own parser class (parse, format_call).")
        raise ValueError(problem[0])
    try:
        obj = import_object(name, key)
    except PluginError as e:
        raise ValueError(str(e)) from e
    wrong = f"{key}: {name!r} is not a tool-call parser; it needs methods parse(text) and format_call(name, arguments)."
    if isinstance(obj, type):
        if not issubclass(obj, ToolCallParser):
            raise ValueError(wrong)
        try:
            obj = obj()
        except Exception as e:  # noqa: BLE001 - reported with the key
            raise ValueError(f"{key}: creating the parser {name!r} failed: {type(e).__name__}: {e}") from e
    if not isinstance(obj, ToolCallParser):
        raise ValueError(wrong)
    return obj
