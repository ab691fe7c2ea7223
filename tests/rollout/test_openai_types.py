"""Our chat-completion objects against the real ``openai`` package's models, and request parsing."""

from __future__ import annotations

import json

import openai.types.chat as openai_chat
import pytest

from areal_trainer.rollout.agents.openai_types import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageToolCall,
    Choice,
    CompletionUsage,
    Function,
)
from areal_trainer.rollout.agents.requests import ChatMessage, RequestError, error_body, parse_chat_request


def completion() -> ChatCompletion:
    call = ChatCompletionMessageToolCall(id="call_1", function=Function(name="search", arguments='{"q": "x"}'))
    return ChatCompletion(
        model="policy",
        choices=[
            Choice(index=0, message=ChatCompletionMessage(content="Hello"), finish_reason="stop"),
            Choice(index=1, message=ChatCompletionMessage(content=None, tool_calls=[call]), finish_reason="tool_calls"),
            Choice(index=2, message=ChatCompletionMessage(content="Hel"), finish_reason="length"),
        ],
        usage=CompletionUsage(prompt_tokens=7, completion_tokens=5),
    )


def test_real_openai_models_parse_our_dump():
    ours = completion()
    theirs = openai_chat.ChatCompletion.model_validate(ours.model_dump())
    assert (theirs.id, theirs.object, theirs.created, theirs.model) == (ours.id, "chat.completion", ours.created,
                                                                        "policy")
    assert ours.id.startswith("chatcmpl-") and isinstance(ours.created, int)
    assert [c.finish_reason for c in theirs.choices] == ["stop", "tool_calls", "length"]
    assert [c.index for c in theirs.choices] == [0, 1, 2]
    assert theirs.choices[0].message.content == "Hello" and theirs.choices[0].message.role == "assistant"
    assert theirs.choices[0].message.tool_calls is None
    call = theirs.choices[1].message.tool_calls[0]
    assert (call.id, call.type, call.function.name, call.function.arguments) == ("call_1", "function", "search",
                                                                                 '{"q": "x"}')
    assert theirs.choices[1].message.content is None
    assert theirs.usage.model_dump(exclude_none=True) == {"prompt_tokens": 7, "completion_tokens": 5,
                                                          "total_tokens": 12}
    # The JSON text too, as the HTTP endpoint sends it.
    assert openai_chat.ChatCompletion.model_validate_json(ours.model_dump_json()) == theirs


def test_dump_is_the_api_json():
    ours = completion()
    assert ours.model_dump() == ours.to_dict()
    assert ours.model_dump() == json.loads(ours.model_dump_json())
    assert ours.model_dump()["choices"][0] == {
        "index": 0, "message": {"role": "assistant", "content": "Hello", "refusal": None},
        "logprobs": None, "finish_reason": "stop"}
    assert ours.choices[1].message.model_dump() == {
        "role": "assistant", "content": None, "refusal": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]}
    assert ours.choices[1].message.model_dump(exclude_none=True, exclude_unset=True) == {
        "role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                             "function": {"name": "search", "arguments": '{"q": "x"}'}}]}
    assert set(ours.model_dump()) == {"id", "object", "created", "model", "choices", "usage"}


def test_attribute_access_like_the_openai_objects():
    ours = completion()
    assert ours.choices[1].message.tool_calls[0].function.arguments == '{"q": "x"}'
    assert ours.choices[0].logprobs is None and ours.usage.total_tokens == 12
    assert ChatCompletion(model="m", choices=[]).usage is None


def test_invalid_values_are_refused():
    with pytest.raises(ValueError, match="finish_reason: got 'eos'"):
        Choice(index=0, message=ChatCompletionMessage(content="x"), finish_reason="eos")
    with pytest.raises(TypeError, match="json.dumps"):
        Function(name="f", arguments={"q": 1})


def test_error_body():
    assert error_body("Bad key", "invalid_request_error", code="invalid_api_key") == {
        "error": {"message": "Bad key", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    err = RequestError(404, "No such completion 'x'.", param="completion_id")
    assert err.status == 404 and err.body()["error"]["param"] == "completion_id"
    assert RequestError(503, "busy").body()["error"]["type"] == "server_error"


# ------------------------------------------------------------------------------------ requests

TOOL = {"type": "function", "function": {"name": "search", "description": "Search.",
                                         "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}


def test_full_request():
    req = parse_chat_request({
        "model": "anything", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Find x", "name": "alice"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]},
            {"role": "tool", "content": "found", "tool_call_id": "call_1"},
        ],
        "tools": [TOOL], "tool_choice": "required", "max_completion_tokens": 64, "temperature": 0.7, "top_p": 0.9,
        "stop": "\n\n", "n": 4, "seed": 1, "stream": False, "logprobs": True, "user": "u1",
    })
    assert req.model == "anything" and req.tools == [TOOL] and req.tool_choice == "required"
    assert (req.max_tokens, req.temperature, req.top_p, req.stop, req.n, req.seed) == (64, 0.7, 0.9, ["\n\n"], 4, 1)
    assert req.ignored == ("logprobs", "user")
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[1] == ChatMessage(role="user", content="Find x", name="alice")
    assert req.messages[2].to_dict() == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]}
    assert req.messages[3].to_dict() == {"role": "tool", "content": "found", "tool_call_id": "call_1"}


def test_defaults_and_lenient_inputs():
    req = parse_chat_request({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                              {"type": "text", "text": "b"}]},
                                           {"role": "user", "content": "hi"}]})
    assert req.model is None and req.messages[0] == ChatMessage(role="system", content="a\nb")
    assert (req.tools, req.tool_choice, req.max_tokens, req.stop, req.n, req.temperature) == ([], "none", None, [], 1,
                                                                                            None)
    req = parse_chat_request({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "now"}],
                              "max_tokens": 5})
    assert req.tool_choice == "auto" and req.tools == [{"type": "function", "function": {"name": "now"}}]


def test_a_dumped_response_message_can_be_sent_back():
    message = completion().choices[1].message.model_dump()
    req = parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}, message,
                                                         {"role": "tool", "tool_call_id": "call_1", "content": "y"}]})
    assert req.messages[1].tool_calls[0]["function"] == {"name": "search", "arguments": '{"q": "x"}'}


def test_named_tool_choice():
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}
    choice = {"type": "function", "function": {"name": "search"}}
    assert parse_chat_request({**body, "tool_choice": choice}).tool_choice == choice


USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("body, param, words", [
    ({"messages": USER, "stream": True}, "stream", "streaming is not supported"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"model": "m"}, "messages", "non-empty list"),
    ({"messages": USER, "model": 3}, "model", "expected a string"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "got 'bot'"),
    ({"messages": ["hi"]}, "messages[0]", "expected an object"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "needs content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].image_url", "expected the image's URL as a string"),
    ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages[0].content[0]",
     "expected a text part"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]}, "messages[0].tool_calls[0]", "expected"),
    ({"messages": USER, "temperature": 3}, "temperature", "from 0 to 2, got 3"),
    ({"messages": USER, "top_p": "high"}, "top_p", "got 'high'"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens", "integer >= 1"),
    ({"messages": USER, "max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens", "only one"),
    ({"messages": USER, "n": True}, "n", "expected an integer"),
    ({"messages": USER, "stop": ["a", 1]}, "stop", "list of them"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0]", "invalid"),
    ({"messages": USER, "tools": TOOL}, "tools", "expected a list"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice", "at least one tool"),
    ({"messages": USER, "tool_choice": "sometimes", "tools": [TOOL]}, "tool_choice", "got 'sometimes'"),
    ({"messages": USER, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "calc"}}},
     "tool_choice", "'calc', which is not in 'tools' (search)"),
])
def test_bad_requests_name_the_field(body, param, words):
    with pytest.raises(RequestError) as e:
        parse_chat_request(body)
    assert e.value.status == 400 and e.value.param == param
    assert words in e.value.message and (f"'{param}'" in e.value.message or param == "messages")


def test_non_object_body():
    with pytest.raises(RequestError, match="must be a JSON object, got list"):
        parse_chat_request([])
