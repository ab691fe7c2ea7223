"""Tools: schemas from functions and OpenAI specs, running calls (errors become the model's
observation), and the tool-call parsers (each format read, malformed blocks kept, round trips)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_trainer.rollout.agents.tool_parsers import TOOL_CALL_PARSERS, ParsedOutput, ToolCall, get_parser
from areal_trainer.rollout.agents.tools import (
    Tool,
    ToolResult,
    arun_tool,
    run_tool,
    tool_from_function,
    tool_from_openai,
)

# ------------------------------------------------------------------------------------ schemas


def get_weather(city: str, days: int, unit: Literal["celsius", "fahrenheit"] = "celsius",
                hourly: bool = False, threshold: float | None = None, tags: list[str] | None = None,
                extra: dict = None) -> str:
    """Get the weather forecast for a city.

    It calls a made-up service; this paragraph is not part of the description.

    Args:
        city (str): Name of the city,
            e.g. Paris.
        days: How many days to forecast.
        unit: Temperature unit.
        hourly: Whether to give hourly values.
        threshold: Only report values above this.

    Returns:
        The forecast as text.
    """
    return f"{city}: sunny for {days} days"


def test_schema_from_function_with_google_docstring():
    expected = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "Name of the city, e.g. Paris."},
                    "days": {"type": "integer", "description": "How many days to forecast."},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit."},
                    "hourly": {"type": "boolean", "description": "Whether to give hourly values."},
                    "threshold": {"type": ["number", "null"], "description": "Only report values above this."},
                    "tags": {"type": ["array", "null"], "items": {"type": "string"}},  # not in Args: no description
                    "extra": {"type": "object"},
                },
                "required": ["city", "days"],
            },
        },
    }
    tool = tool_from_function(get_weather)
    assert tool.to_openai() == expected
    assert tool.fn is get_weather and tool.name == "get_weather"


def test_schema_optional_literal_list_union_and_unannotated():
    def f(a: Optional[int],  # noqa: UP045 - typing.Optional is tested on purpose
          b: Literal[1, 2], c: list[list[float]], d: int | str, e, g: Literal["x"] | None = None,
          h: tuple[str, ...] = ()):
        """No sections here: the whole first paragraph
        is the description."""

    props = tool_from_function(f).parameters["properties"]
    assert props["a"] == {"type": ["integer", "null"]}
    assert props["b"] == {"type": "integer", "enum": [1, 2]}
    assert props["c"] == {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
    assert props["d"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["e"] == {}
    assert props["g"] == {"type": ["string", "null"], "enum": ["x", None]}
    assert props["h"] == {"type": "array", "items": {"type": "string"}}
    assert tool_from_function(f).parameters["required"] == ["a", "b", "c", "d", "e"]
    assert tool_from_function(f).description == "No sections here: the whole first paragraph is the description."


def test_schema_without_docstring_and_parameters():
    def now():
        return "12:00"

    tool = tool_from_function(now)
    assert tool.description == ""
    assert tool.parameters == {"type": "object", "properties": {}, "required": []}


class Point:
    pass


def star_args(*args):
    pass


def star_kwargs(**kwargs):
    pass


def positional_only(a, /):
    pass


@pytest.mark.parametrize("fn", [star_args, star_kwargs, positional_only])
def test_signatures_that_cannot_be_filled_from_json_raise(fn):
    with pytest.raises(ValueError, match=f"tool '{fn.__name__}': parameter .* cannot be filled from JSON"):
        tool_from_function(fn)


def test_unsupported_annotation_raises_naming_the_parameter():
    def f(p: Point):
        pass

    with pytest.raises(ValueError, match=r"tool 'f', parameter 'p': annotation .*Point.* has no JSON schema"):
        tool_from_function(f)


def test_lambda_has_no_usable_name():
    with pytest.raises(ValueError, match="no usable name"):
        tool_from_function(lambda x: x)


SPEC = {"name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}


@pytest.mark.parametrize("spec", [SPEC, {"type": "function", "function": SPEC}])
def test_tool_from_openai_both_shapes(spec):
    tool = tool_from_openai(spec)
    assert tool == Tool(name="search", description="Search the web.", parameters=SPEC["parameters"], fn=None)
    assert tool.to_openai() == {"type": "function", "function": SPEC}


def test_tool_from_openai_defaults_and_fn():
    tool = tool_from_openai({"name": "ping"}, fn=lambda: "pong")
    assert tool.description == "" and tool.parameters == {"type": "object", "properties": {}}
    assert run_tool(tool, "{}").content == "pong"


@pytest.mark.parametrize("spec, words", [
    ("search", "give a dict"),
    ({"type": "retrieval", "function": SPEC}, "only 'function' tools"),
    ({"type": "function", "function": "search"}, "'function' must be a dict"),
    ({"description": "no name"}, "name None is invalid"),
    ({"name": "has space"}, "name 'has space' is invalid"),
    ({"name": "f", "description": 3}, "description must be a string"),
    ({"name": "f", "parameters": {"type": "array"}}, "parameters must be a JSON schema of type 'object'"),
    ({"name": "f", "parameters": {"type": "object", "properties": []}}, "properties must be a dict"),
])
def test_tool_from_openai_rejects_malformed_specs(spec, words):
    with pytest.raises(ValueError, match=words):
        tool_from_openai(spec)


# ------------------------------------------------------------------------------------ running


def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


def stats(values: list[float]) -> dict:
    return {"n": len(values), "sum": sum(values)}


def test_run_tool_success_text_and_json():
    assert run_tool(tool_from_function(divide), '{"a": 6, "b": 3}') == run_tool(tool_from_function(divide),
                                                                                 {"a": 6, "b": 3})
    result = run_tool(tool_from_function(divide), '{"a": 6, "b": 3}')
    assert result.ok and result.content == "2.0"
    result = run_tool(tool_from_function(stats), {"values": [1, 2]})
    assert result.ok and json.loads(result.content) == {"n": 2, "sum": 3}


def test_run_tool_empty_arguments_mean_no_arguments():
    def now() -> str:
        return "noon"

    for args in ("", "  ", None, "{}", {}):
        assert run_tool(tool_from_function(now), args).content == "noon"


def test_raising_tool_becomes_error_text():
    result = run_tool(tool_from_function(divide), '{"a": 1, "b": 0}')
    assert result == ToolResult("Error: ZeroDivisionError: division by zero", ok=False)


@pytest.mark.parametrize("args, words", [
    ('{"a": 1, "b": ', "not valid JSON"),
    ("[1, 2]", "must be a JSON object, got list"),
    ('{"a": 1}', "missing required argument(s) b"),
    ('{"a": 1, "b": 2, "c": 3}', "unknown argument(s) c"),
])
def test_bad_arguments_become_error_text(args, words):
    result = run_tool(tool_from_function(divide), args)
    assert not result.ok and result.content.startswith("Error: ") and words in result.content
    assert "(parameters: a, b)" in result.content or "JSON" in result.content


def test_schema_only_tool_is_an_error_result_not_an_exception():
    result = run_tool(tool_from_openai(SPEC), {"q": "x"})
    assert not result.ok and "no implementation" in result.content


async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


def test_async_tool_with_arun_tool_and_run_tool():
    tool = tool_from_function(async_add)
    assert asyncio.run(arun_tool(tool, '{"a": 1, "b": 2}')).content == "3"
    assert run_tool(tool, '{"a": 1, "b": 2}').content == "3"  # run_tool drives it in a fresh loop


def test_run_tool_refuses_async_tool_inside_running_loop():
    async def inside():
        return run_tool(tool_from_function(async_add), {"a": 1, "b": 2})

    result = asyncio.run(inside())
    assert not result.ok and "arun_tool" in result.content


def test_arun_tool_runs_sync_tools_in_a_worker_thread():
    def where() -> str:
        return threading.current_thread().name

    result = asyncio.run(arun_tool(tool_from_function(where), {}))
    assert result.ok and result.content != threading.current_thread().name


def test_arun_tool_errors_and_timeout():
    async def slow() -> str:
        await asyncio.sleep(10)
        return "late"

    async def own_timeout():
        raise TimeoutError("upstream")

    result = asyncio.run(arun_tool(tool_from_function(slow), {}, timeout=0.05))
    assert result == ToolResult("Error: tool 'slow' timed out after 0.05 s.", ok=False, ended="cancelled")
    result = asyncio.run(arun_tool(tool_from_function(own_timeout), {}, timeout=5))
    assert result.content == "Error: TimeoutError: upstream" and not result.ok
    result = asyncio.run(arun_tool(tool_from_function(divide), {"a": 1, "b": 0}))
    assert result.content == "Error: ZeroDivisionError: division by zero" and not result.ok


# ------------------------------------------------------------------------------------ parsers


def calls(out: ParsedOutput) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in out.tool_calls]


def test_tool_call_ids_are_openai_like_and_unique():
    out = TOOL_CALL_PARSERS["hermes"].parse(HERMES_TWO)
    ids = [c.id for c in out.tool_calls]
    assert all(i.startswith("call_") and len(i) == 29 for i in ids) and len(set(ids)) == 2
    call = out.tool_calls[0]
    assert call.to_openai() == {"id": call.id, "type": "function",
                                "function": {"name": "search", "arguments": '{"q": "x"}'}}


HERMES_TWO = ('<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')


def test_hermes_single_two_and_content():
    p = TOOL_CALL_PARSERS["hermes"]
    out = p.parse('<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>')
    assert (out.content, calls(out), out.failed) == (None, [("search", {"q": "x"})], 0)
    out = p.parse(HERMES_TWO)
    assert calls(out) == [("search", {"q": "x"}), ("add", {"a": 1, "b": 2})] and out.content is None
    out = p.parse("Let me look.\n" + HERMES_TWO + "\nDone.")
    assert out.content == "Let me look.\n\n\nDone." and len(out.tool_calls) == 2 and out.failed == 0
    assert p.parse("plain answer ").content == "plain answer"
    assert p.parse("plain answer").tool_calls == []


def test_hermes_closing_tag_inside_an_argument_and_unclosed_last_block():
    p = TOOL_CALL_PARSERS["hermes"]
    out = p.parse('<tool_call>{"name": "echo", "arguments": {"s": "</tool_call>"}}</tool_call>')
    assert calls(out) == [("echo", {"s": "</tool_call>"})] and out.failed == 0
    out = p.parse('ok <tool_call>\n{"name": "f", "arguments": {}}\n')  # the model stopped before the tag
    assert calls(out) == [("f", {})] and out.content == "ok"


@pytest.mark.parametrize("block", [
    "<tool_call>\n{not json}\n</tool_call>",
    '<tool_call>\n{"arguments": {"q": 1}}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": "q=1"}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {}} trailing\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {"q": ',  # cut off mid-call
])
def test_hermes_malformed_block_stays_in_content(block):
    good = '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    out = TOOL_CALL_PARSERS["hermes"].parse(f"{good}\nBefore {block}")
    assert out.failed == 1 and calls(out) == [("g", {})]
    assert out.content == f"Before {block}".strip()


def test_mistral_single_two_content_and_malformed():
    p = TOOL_CALL_PARSERS["mistral"]
    out = p.parse('[TOOL_CALLS] [{"name": "search", "arguments": {"q": "x"}}]')
    assert (out.content, calls(out), out.failed) == (None, [("search", {"q": "x"})], 0)
    out = p.parse('Sure. [TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"n": 1}}] ')
    assert (out.content, calls(out), out.failed) == ("Sure.", [("a", {}), ("b", {"n": 1})], 0)
    bad = '[TOOL_CALLS][{"name": "a", "arguments": 3}]'
    out = p.parse(f'x {bad} [TOOL_CALLS][{{"name": "ok", "arguments": {{}}}}] [TOOL_CALLS] oops')
    assert calls(out) == [("ok", {})] and out.failed == 2
    assert out.content == f"x {bad}  [TOOL_CALLS] oops"


def test_llama3_json_single_two_content_and_malformed():
    p = TOOL_CALL_PARSERS["llama3_json"]
    out = p.parse('{"name": "search", "parameters": {"q": "x"}}')
    assert (out.content, calls(out), out.failed) == (None, [("search", {"q": "x"})], 0)
    out = p.parse('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"n": 1}}')
    assert calls(out) == [("a", {}), ("b", {"n": 1})] and out.failed == 0
    assert p.parse("The answer is 4.") == ParsedOutput("The answer is 4.", [], 0)
    for bad in ('{"name": "a", "parameters": {}} and more', '{"parameters": {}}', '{"name": "a"'):
        assert p.parse(bad) == ParsedOutput(bad, [], 1)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,30}", fullmatch=True)
ARGS = st.dictionaries(st.text(max_size=8), JSON, max_size=4)
CONTENT = st.text(max_size=30).filter(lambda s: "tool_call>" not in s and "[TOOL_CALLS]" not in s)


@pytest.mark.parametrize("parser", sorted(TOOL_CALL_PARSERS))
@settings(max_examples=60, deadline=None)
@given(name=NAMES, args=ARGS, name2=NAMES, args2=ARGS, content=CONTENT, as_string=st.booleans())
def test_format_call_parses_back(parser, name, args, name2, args2, content, as_string):
    p = TOOL_CALL_PARSERS[parser]
    one = p.format_call(name, json.dumps(args) if as_string else args)
    two = p.format_call(name2, args2)
    if parser == "llama3_json":  # the whole message is the calls: no content around them
        text, content = f"{one}; {two}", ""
    else:
        text = f"{content}{one}\n{two}"
    out = p.parse(text)
    assert calls(out) == [(name, args), (name2, args2)]
    assert out.failed == 0 and out.content == (content.strip() or None)


def test_hermes_format_matches_qwen_template():
    text = TOOL_CALL_PARSERS["hermes"].format_call("f", '{"x": "é"}')
    assert text == '<tool_call>\n{"name": "f", "arguments": {"x": "é"}}\n</tool_call>'
    assert TOOL_CALL_PARSERS["mistral"].format_call("f", {}) == '[TOOL_CALLS][{"name": "f", "arguments": {}}]'
    with pytest.raises(ValueError, match="must be a JSON object"):
        TOOL_CALL_PARSERS["hermes"].format_call("f", "[1]")


# ---------------------------------------------------------------------------- parser registry


class UpperParser:
    """A custom parser, loaded by import path in a test."""

    def parse(self, text: str) -> ParsedOutput:
        return ParsedOutput(text.upper(), [], 0)

    def format_call(self, name, arguments) -> str:
        return name


def test_get_parser_by_name_and_import_path():
    assert get_parser("hermes", "rollout.tool_call_parser") is TOOL_CALL_PARSERS["hermes"]
    parser = get_parser("tests.rollout.test_tools.UpperParser", "rollout.tool_call_parser")
    assert parser.parse("a").content == "A"


def test_get_parser_unknown_name_lists_parsers_and_suggests():
    with pytest.raises(ValueError) as e:
        get_parser("hermse", "rollout.tool_call_parser")
    msg = str(e.value)
    assert msg.startswith("rollout.tool_call_parser: got 'hermse'")
    assert "'hermes', 'llama3_json', 'mistral'" in msg and "Did you mean 'hermes'?" in msg


def test_get_parser_import_path_errors_name_the_key():
    with pytest.raises(ValueError, match=r"^my.key: module 'no_such_pkg' not found"):
        get_parser("no_such_pkg.Parser", "my.key")
    with pytest.raises(ValueError, match=r"^my.key: 'tests.rollout.test_tools.ToolCall' is not a tool-call parser"):
        get_parser("tests.rollout.test_tools.ToolCall", "my.key")
    assert ToolCall  # imported for the line above
