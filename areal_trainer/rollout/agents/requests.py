"""Chat-completion requests: validating a ``/v1/chat/completions`` body, and OpenAI-style errors.

``parse_chat_request`` checks a body and returns a ``ChatRequest``, or raises ``RequestError`` (an
HTTP status and an OpenAI-style message naming the field), which chat handlers raise too (e.g. 404
for an unknown id); ``error_body`` is the JSON the endpoint answers an error with, so clients raise
their usual exceptions. Parsing is lenient where real agents differ from the spec without harm:
unknown fields are ignored (listed in ``ChatRequest.ignored``), messages may carry the extra keys a
dumped response message has (``refusal``, ``annotations``, ...), text content may come as a list of
text parts, and ``developer`` is read as ``system`` (OpenAI's newer name for it; chat templates know only
``system``). User messages may carry images as ``image_url`` parts with data URLs (``images.py``).

The response objects are :mod:`areal_trainer.rollout.agents.openai_types`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from areal_trainer.rollout.agents.images import BadImage, decode_image_url
from areal_trainer.rollout.agents.tools import tool_from_openai

ROLES = ("system", "user", "assistant", "tool")
TOOL_CHOICES = ("auto", "none", "required")
# Request fields this endpoint reads; any other field is ignored (and listed in ChatRequest.ignored).
_KNOWN = {"model", "messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "stop", "n", "seed", "stream"}


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an OpenAI API error."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class RequestError(Exception):
    """A request the endpoint refuses: ``status`` is the HTTP status, ``message`` is shown to the
    client. Raised by ``parse_chat_request`` and by chat handlers (e.g. 404 for an unknown id)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return error_body(self.message, kind, code=self.code, param=self.param)


@dataclass(frozen=True, kw_only=True)
class ChatMessage:
    role: str
    content: str | list[dict[str, Any]] | None = None
    """Text, or (a message with images) a list of text parts and ``{"type": "image"}`` placeholders."""
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI shape; arguments as JSON strings
    tool_call_id: str | None = None
    name: str | None = None
    images: tuple = ()
    """The message's images (RGB PIL images), in the order of its image placeholders."""

    def to_dict(self) -> dict[str, Any]:
        """The message for a chat template: role and content, plus the other keys that are set."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True, kw_only=True)
class ChatRequest:
    model: str | None
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] = field(default_factory=list)  # {"type": "function", "function": {...}}
    tool_choice: str | dict[str, Any] = "none"  # "auto" | "none" | "required" | {"type": "function", ...}
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    ignored: tuple[str, ...] = ()

    @property
    def images(self) -> list:
        """Every image of the messages, in order."""
        return [im for m in self.messages for im in m.images]


def _bad(param: str, message: str) -> RequestError:
    return RequestError(400, f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def _int(body: dict[str, Any], key: str, minimum: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
        raise _bad(key, f"expected an integer{f' >= {minimum}' if minimum is not None else ''}, got {value!r}.")
    return value


def _float(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _bad(key, f"expected a number from {low:g} to {high:g}, got {value!r}.")
    return float(value)


def _content(value: Any, param: str) -> tuple[str | list[dict] | None, tuple]:
    """Message content and its images: a string, null, or a list of parts. Text parts alone are joined by
    newlines; with ``image_url`` parts (data URLs, ``images.py``) the content stays a list of text parts and
    ``{"type": "image"}`` placeholders, in order (the form a VLM's chat template renders), beside the images."""
    if value is None or isinstance(value, str):
        return value, ()
    if not isinstance(value, list):
        raise _bad(param, f"expected a string or a list of content parts, got {type(value).__name__}.")
    parts, images = [], []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            ref = part.get("image_url")
            try:
                images.append(decode_image_url(ref.get("url") if isinstance(ref, dict) else ref))
            except BadImage as e:
                raise _bad(f"{param}[{i}].image_url", str(e)) from None
            parts.append({"type": "image"})
        else:
            raise _bad(f"{param}[{i}]", "expected a text part {'type': 'text', 'text': ...} or an image part "
                       f"{{'type': 'image_url', 'image_url': {{'url': 'data:image/...'}}}}, got {part!r:.200}.")
    if not images:
        return "\n".join(p["text"] for p in parts), ()
    return parts, tuple(images)


def _tool_calls(value: Any, param: str) -> list[dict[str, Any]] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise _bad(param, f"expected a list of tool calls, got {type(value).__name__}.")
    calls = []
    for i, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"{param}[{i}]", "expected {'id': ..., 'type': 'function', 'function': "
                       f"{{'name': ..., 'arguments': '<JSON>'}}}}, got {call!r}.")
        args = fn.get("arguments", "{}")
        args = _arguments(args, f"{param}[{i}].function.arguments")
        calls.append({"id": str(call.get("id") or ""), "type": "function",
                      "function": {"name": fn["name"], "arguments": args}})
    return calls


def _arguments(value: Any, param: str) -> str:
    """A tool call's arguments as JSON text of an object (as OpenAI sends them); an object is accepted too."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        try:
            decoded = json.loads(value or "{}")
        except json.JSONDecodeError as e:
            raise _bad(param, f"expected the call's arguments as JSON text of an object, got {value!r:.200} "
                       f"({e.msg} at position {e.pos}).") from None
        if isinstance(decoded, dict):
            return value
    raise _bad(param, f"expected the call's arguments as JSON text of an object, got {value!r:.200}.")


def _message(raw: Any, i: int) -> ChatMessage:
    param = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise _bad(param, f"expected an object with 'role' and 'content', got {type(raw).__name__}.")
    role = "system" if raw.get("role") == "developer" else raw.get("role")
    if role not in ROLES:
        raise _bad(f"{param}.role", f"got {raw.get('role')!r}; must be one of {', '.join(ROLES)}.")
    content, images = _content(raw.get("content"), f"{param}.content")
    if images and role != "user":
        raise _bad(f"{param}.content", f"image parts are taken in user messages only (this is a {role} message).")
    tool_calls = _tool_calls(raw.get("tool_calls"), f"{param}.tool_calls") if role == "assistant" else None
    if content is None and not tool_calls and role != "assistant":
        raise _bad(f"{param}.content", f"a {role} message needs content.")
    for key in ("tool_call_id", "name"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise _bad(f"{param}.{key}", f"expected a string, got {raw[key]!r}.")
    return ChatMessage(role=role, content=content, tool_calls=tool_calls,
                       tool_call_id=raw.get("tool_call_id"), name=raw.get("name"), images=images)


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad("tools", f"expected a list of function tools, got {type(value).__name__}.")
    tools = []
    for i, spec in enumerate(value):
        try:
            tool_from_openai(spec)
        except ValueError as e:
            raise _bad(f"tools[{i}]", str(e)) from e
        # Kept as sent (the model should see the agent's schema verbatim), in the wrapped form.
        tools.append(spec if "function" in spec else {"type": "function", "function": spec})
    return tools


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """OpenAI's default: "auto" when there are tools, else "none"."""
    if value is None:
        return "auto" if tools else "none"
    if isinstance(value, str) and value in TOOL_CHOICES:
        if value == "required" and not tools:
            raise _bad("tool_choice", "'required' needs at least one tool in 'tools'.")
        return value
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise _bad("tool_choice", f"got {value!r}; use 'auto', 'none', 'required' or "
                   "{'type': 'function', 'function': {'name': ...}}.")
    names = [t["function"]["name"] for t in tools]
    if name not in names:
        raise _bad("tool_choice", f"names tool {name!r}, which is not in 'tools' ({', '.join(names) or 'none'}).")
    return {"type": "function", "function": {"name": name}}


def _stop(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad("stop", f"expected a non-empty string or a list of them, got {value!r}.")
    return stops


def _max_tokens(body: dict[str, Any]) -> int | None:
    old, new = _int(body, "max_tokens", 1), _int(body, "max_completion_tokens", 1)
    if old is not None and new is not None and old != new:
        raise _bad("max_completion_tokens", f"{new} differs from max_tokens={old}; give only one of them.")
    return new if new is not None else old


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body; raises ``RequestError`` (400) naming the field."""
    if not isinstance(body, dict):
        raise RequestError(400, f"The request body must be a JSON object, got {type(body).__name__}.")
    if body.get("stream"):
        raise _bad("stream", "streaming is not supported by this endpoint; send stream=false (the default).")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise _bad("model", f"expected a string, got {body['model']!r}.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else type(messages).__name__
        raise RequestError(400, f"'messages' must be a non-empty list of messages, got {got}.",
                           param="messages", code="invalid_value")
    tools = _tools(body.get("tools"))
    temperature = _float(body, "temperature", 0.0, 2.0)
    return ChatRequest(
        model=body.get("model"), messages=[_message(m, i) for i, m in enumerate(messages)], tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools), max_tokens=_max_tokens(body),
        temperature=temperature, top_p=_float(body, "top_p", 0.0, 1.0), stop=_stop(body.get("stop")),
        n=_int(body, "n", 1) or 1, seed=_int(body, "seed", None), ignored=tuple(sorted(set(body) - _KNOWN)),
    )
