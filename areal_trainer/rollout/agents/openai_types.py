"""Chat-completion response objects shaped like the ``openai`` package's.

Agent code written for ``openai.AsyncOpenAI`` reads responses by attribute
(``resp.choices[0].message.tool_calls[0].function.arguments``) and often appends
``message.model_dump()`` back into its message list. The dataclasses here support both, so the
in-process client can return them without depending on the ``openai`` package (a dev-only
dependency); ``model_dump()`` / ``to_dict()`` give exactly the JSON body the API returns, which the
HTTP endpoint sends as is and the real client parses. The pydantic keyword arguments agents pass
to ``model_dump`` (``exclude_none``, ``exclude_unset``, ``mode``, ...) are accepted; only
``exclude_none`` changes the output, because these objects hold no unset fields.

The request side (validating a ``/v1/chat/completions`` body, and the errors refusing one) is
:mod:`areal_trainer.rollout.agents.requests`.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

FINISH_REASONS = ("stop", "length", "tool_calls")


class _Dumpable:
    """``model_dump`` / ``to_dict`` / ``model_dump_json`` for the dataclasses below."""

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def model_dump(self, *, exclude_none: bool = False, **_pydantic_options: Any) -> dict[str, Any]:
        return _dump(self._fields(), exclude_none)

    def to_dict(self, *, exclude_none: bool = False, **_pydantic_options: Any) -> dict[str, Any]:
        return self.model_dump(exclude_none=exclude_none)

    def model_dump_json(self, *, indent: int | None = None, exclude_none: bool = False,
                        **_pydantic_options: Any) -> str:
        return json.dumps(self.model_dump(exclude_none=exclude_none), indent=indent, ensure_ascii=False)

    to_json = model_dump_json


def _dump(value: Any, exclude_none: bool) -> Any:
    if isinstance(value, _Dumpable):
        return _dump(value._fields(), exclude_none)
    if isinstance(value, dict):
        return {k: _dump(v, exclude_none) for k, v in value.items() if not (exclude_none and v is None)}
    if isinstance(value, list | tuple):
        return [_dump(v, exclude_none) for v in value]
    return value


def new_completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


@dataclass(kw_only=True)
class Function(_Dumpable):
    name: str
    arguments: str  # a JSON object, as text (OpenAI's convention; the agent json.loads it)

    def __post_init__(self) -> None:
        if not isinstance(self.arguments, str):
            raise TypeError(f"Function.arguments must be a JSON string, got {type(self.arguments).__name__}; "
                            "pass json.dumps(arguments).")

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(kw_only=True)
class ChatCompletionMessageToolCall(_Dumpable):
    id: str
    function: Function
    type: str = "function"

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "function": self.function}


@dataclass(kw_only=True)
class ChatCompletionMessage(_Dumpable):
    content: str | None = None
    tool_calls: list[ChatCompletionMessageToolCall] | None = None
    role: str = "assistant"
    refusal: str | None = None

    def _fields(self) -> dict[str, Any]:
        # Like the API, ``tool_calls`` is present only when there are calls.
        out = {"role": self.role, "content": self.content, "refusal": self.refusal}
        return out | ({"tool_calls": self.tool_calls} if self.tool_calls else {})


@dataclass(kw_only=True)
class Choice(_Dumpable):
    index: int
    message: ChatCompletionMessage
    finish_reason: str
    logprobs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Choice.finish_reason: got {self.finish_reason!r}; must be one of {FINISH_REASONS}.")

    def _fields(self) -> dict[str, Any]:
        return {"index": self.index, "message": self.message, "logprobs": self.logprobs,
                "finish_reason": self.finish_reason}


@dataclass(kw_only=True)
class CompletionUsage(_Dumpable):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int | None = None  # None: the sum of the two

    def __post_init__(self) -> None:
        if self.total_tokens is None:
            self.total_tokens = self.prompt_tokens + self.completion_tokens

    def _fields(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass(kw_only=True)
class ChatCompletion(_Dumpable):
    model: str
    choices: list[Choice]
    usage: CompletionUsage | None = None
    id: str = field(default_factory=new_completion_id)
    created: int = field(default_factory=lambda: int(time.time()))
    object: str = "chat.completion"

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": self.choices, "usage": self.usage}
