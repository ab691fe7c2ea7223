"""One episode's chat calls, served by the policy and recorded for training.

:class:`EpisodeSession` serves one episode's chat requests (it is the ``ChatHandler`` the HTTP
endpoint routes an episode's key to, and what the in-process clients call). A request's messages and
tools are rendered by the tokenizer's chat template (``rollout.chat_template_type``: ``hf`` renders every
call whole; ``concat`` continues an earlier call's exact ids, ``template.py``), the prompt ids are sampled
by the rollout engine through the shared :class:`~areal_trainer.rollout.engines.batcher.GenerationBatcher`,
and the sampled text is parsed for tool calls by the run's tool-call parser. Each choice is recorded as a
:class:`CallRecord` with the exact prompt ids, output ids, behaviour log-probs and per-token policy
versions: training rows are built from these records only, never from re-tokenized text.

The clients an agent holds (``client.py``) call :meth:`EpisodeSession.create` for each chat
completion and :meth:`EpisodeSession.call_tool` for each tool call; a tool that raises returns its error
text, and is counted.

Sampling. The request's ``temperature`` (0 is greedy), ``top_p``, ``max_tokens`` and ``stop`` override
``gconfig``; ``max_tokens`` never exceeds ``gconfig.max_new_tokens``, and prompt plus answer stay within
the row limit (``rollout/limits.py``; an engine's answer beyond its budget is cut, as workflows cut it).
A prompt with no room for an answer gets ``finish_reason: "length"`` and no content, and nothing is
sampled or trained.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...dtypes import fits_float32
from ...failures import DEFAULT, KindPolicy
from ...model.chat import template_message
from ..engines.batcher import GenerationBatcher
from ..limits import capped, engine_positions, row_tokens
from .images import BadImage, render_with_images
from .openai_types import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageToolCall,
    Choice,
    CompletionUsage,
    Function,
    new_completion_id,
)
from .requests import ChatRequest, RequestError
from .template import CHAT_TEMPLATE_TYPES, RenderedCall, Renderer, extend
from .tool_parsers import ToolCallParser
from .tools import Tool, arun_tool, tool_from_function, tool_from_openai


@dataclass
class CallRecord:
    """One sampled choice of one chat call, exactly as the engine produced it."""

    completion_id: str
    index: int
    """The choice's index within its call (``n > 1``)."""
    call: int
    """The call's number within the episode (0, 1, ...)."""
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    truncated: bool
    reward: float | None = None
    vision: Any = None
    """The prompt's processed images (``model/vision.py``'s ``VisionInput``), None for a text prompt."""


@dataclass
class EpisodeCounters:
    """What went wrong inside one episode without ending it."""

    calls: int = 0
    tool_parse_failures: int = 0
    tool_calls: int = 0
    """Tool calls read out of the model's answers (to requests that offered tools), whoever runs them."""
    tool_runs: int = 0
    """``call_tool`` runs."""
    tool_errors: int = 0
    """``call_tool`` runs that failed: an unknown tool, bad arguments, or the tool raised."""
    tool_timeouts: int = 0
    """``call_tool`` runs past their time limit (cancelled, or abandoned in their thread)."""
    tool_abandoned: int = 0
    """Of those, plain ``def`` tools left running in their thread."""
    length_refusals: int = 0
    truncated: int = 0
    """Answers that stopped at their token budget (``max_tokens``, ``gconfig.max_new_tokens`` or the row limit)."""
    bad_requests: int = 0
    """Requests refused with a 4xx: malformed, unrenderable, an unknown completion id, a reward too early, too
    many choices or calls."""
    chat_template_fallbacks: int = 0
    """With ``chat_template_type=concat``: calls after the episode's first that extended no earlier call and were
    rendered whole by the template (``template.py``)."""


class EpisodeSession:
    """Serves and records the chat calls of one episode (see the module docstring).

    Args:
        episode: the episode's index in its rollout (orders its requests within a batched call).
        tokenizer: the policy's tokenizer, with a chat template.
        batcher: the rollout's generation batcher.
        gconfig: the rollout's sampling settings (``gconfig``).
        parser: reads tool calls out of sampled text.
        model_name: the name responses carry.
        max_calls: the most calls of the episode (``rollout.agent_max_calls``); one more is refused with 429.
        max_choices: the largest ``n`` of one request (``rollout.agent_max_choices``); a larger one: 400.
        chat_template_type: ``hf`` or ``concat`` (``rollout.chat_template_type``, ``template.py``).
        renderer: the rollout call's shared renders (None: the session's own).
        tool_policy: the failure policy's tool kind: a tool call's time limit when ``call_tool`` names none.
        vision: the policy's processor (``model/vision.py``'s ``VisionEncoder``) when requests may carry images;
            None: a request with images is refused (400) with ``no_images``, which says why.
    """

    def __init__(self, *, episode: int, tokenizer, batcher: GenerationBatcher, gconfig: Any,
                 parser: ToolCallParser, model_name: str = "policy", max_calls: int = 64, max_choices: int = 16,
                 chat_template_type: str = "hf", renderer: Renderer | None = None,
                 tool_policy: KindPolicy = DEFAULT.tool, vision: Any = None,
                 no_images: str = "the policy is a text-only model"):
        if chat_template_type not in CHAT_TEMPLATE_TYPES:
            raise ValueError(f"chat_template_type {chat_template_type!r}; one of {CHAT_TEMPLATE_TYPES}")
        self.episode, self.tokenizer, self.batcher, self.gconfig = episode, tokenizer, batcher, gconfig
        self.parser, self.model_name, self.max_calls, self.max_choices = parser, model_name, max_calls, max_choices
        self.concat = chat_template_type == "concat"
        self.renderer = renderer if renderer is not None else Renderer(tokenizer)
        self.rendered: list[RenderedCall] = []
        """With ``concat``: the episode's sampled calls, as later calls may continue them."""
        self._asked: tuple | None = None
        """The latest request rendered, with its result (a request asked about is not rendered again)."""
        self.records: list[CallRecord] = []
        self.counters = EpisodeCounters()
        self.first_bad_request: str | None = None
        self.unknown_words: set[str] = set()
        """Words of the rendered requests that the tokenizer cannot spell (they render as its unknown token)."""
        self.tool_names: set[str] = set()
        """The tools offered by requests with such words (to tell which of the words are tool names)."""
        self.tool_policy = tool_policy
        self.tool_overruns: dict[str, str] = {}
        """How the episode's first tool call that ran out of time ended (``cancelled``, ``abandoned``) -> which tool
        it was, for the failure policy's notice."""
        self.vision, self.no_images = vision, no_images
        self.closed = False
        self._calls = 0

    # -- rendering and sampling -------------------------------------------------------------------
    def render(self, request: ChatRequest) -> list[int]:
        """The prompt ids of a request (see :meth:`prompt_of`), counting what the agent should hear about: a
        ``concat`` call that extended no earlier one, words the tokenizer cannot spell."""
        ids, text, extended = self.prompt_of(request)
        self.counters.chat_template_fallbacks += (self.concat and bool(self.rendered) and not extended
                                                  and not request.images)
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is not None and unk in ids:  # the built-in word-level tokenizers: words they do not know
            self.unknown_words.update(self.renderer.unknown_words(text))
            self.tool_names.update(t["function"]["name"] for t in request.tools)
        return ids

    def prompt_of(self, request: ChatRequest) -> tuple[list[int], str, bool]:
        """The prompt ids of a request, the text rendered for them, and whether they continue an earlier call
        (``concat``: that call's ids and the template's segment after its answer; else the messages and tools
        rendered whole by the chat template). A request with images is rendered whole by the processor, which
        expands each image's placeholder to its image tokens (:meth:`images_of` gives the processed images).
        Counts nothing (an agent may ask before it sends)."""
        if self._asked is not None and self._asked[0] is request and self._asked[1] == len(self.rendered):
            return self._asked[2]  # rendered already, with the same calls to continue
        messages = [template_message(m.to_dict()) for m in request.messages]
        if request.images:
            try:
                ids, text, vision = render_with_images(self.vision, self.no_images, messages, request.images,
                                                       request.tools)
            except BadImage as e:
                raise RequestError(400, str(e), param="messages") from e
            self._asked = (request, len(self.rendered), (ids, text, False), vision)
            return self._asked[2]
        ext = extend(self.renderer, self.rendered, messages, request.tools) if self.concat else None
        if ext is not None:
            found = ext.prompt_ids, ext.text, True
        else:
            try:
                ids, text = self.renderer.whole(messages, request.tools)
            except Exception as e:  # noqa: BLE001 - a template that cannot render the messages is a bad request
                raise RequestError(400, f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                                   param="messages") from e
            found = list(ids), text, False
        self._asked = (request, len(self.rendered), found, None)
        return found

    def images_of(self, request: ChatRequest) -> Any:
        """The processed images of the request :meth:`prompt_of` rendered last (None for a text request)."""
        if self._asked is None or self._asked[0] is not request:
            self.prompt_of(request)
        return self._asked[3]

    def sampling(self, request: ChatRequest) -> Any:
        """``gconfig`` with the request's overrides, for one answer."""
        g = self.gconfig
        over: dict[str, Any] = {"n_samples": 1}
        if request.max_tokens is not None:
            over["max_new_tokens"] = min(int(request.max_tokens), int(g.max_new_tokens))
        if request.temperature is not None:
            over.update(greedy=True) if request.temperature == 0 else over.update(temperature=request.temperature)
        if request.top_p is not None:
            over["top_p"] = request.top_p
        if request.stop:
            over["stop"] = [*getattr(g, "stop", []), *request.stop]
        over["min_new_tokens"] = min(int(getattr(g, "min_new_tokens", 0)), over.get("max_new_tokens", g.max_new_tokens))
        if dataclasses.is_dataclass(g):
            return dataclasses.replace(g, **over)
        return type(g)(**{**vars(g), **over})

    # -- refused requests -------------------------------------------------------------------------
    def bad_request(self, error: RequestError) -> None:
        """Count a request refused with a 4xx (the agent gets the error; nothing is sampled or trained)."""
        self.counters.bad_requests += 1
        if self.first_bad_request is None:
            self.first_bad_request = f"{error.status}: {error.message}"

    async def create(self, request: ChatRequest) -> ChatCompletion:
        """Sample ``request.n`` answers and record each (the ``ChatHandler`` method)."""
        try:
            return await self._create(request)
        except RequestError as e:
            self.bad_request(e)
            raise

    async def _create(self, request: ChatRequest) -> ChatCompletion:
        if self.closed:
            raise RequestError(409, "this episode has ended; its client cannot be used any more.")
        if request.n > self.max_choices:
            raise RequestError(400, f"n={request.n} is more choices than one request may ask for (at most "
                               f"rollout.agent_max_choices={self.max_choices}).", param="n")
        if self._calls >= self.max_calls:
            raise RequestError(429, f"this episode has made its {self.max_calls} calls (rollout.agent_max_calls); "
                               "end the episode, or raise the limit.")
        prompt = self.render(request)
        vision = self.images_of(request)
        call, self._calls = self._calls, self._calls + 1
        self.counters.calls += 1
        cid = new_completion_id()
        limit = row_tokens(self.gconfig, engine_positions(self.batcher.engine))
        if len(prompt) >= limit:
            self.counters.length_refusals += 1
            choices = [Choice(index=i, message=ChatCompletionMessage(content=""), finish_reason="length")
                       for i in range(request.n)]
            return ChatCompletion(id=cid, model=request.model or self.model_name, choices=choices,
                                  usage=CompletionUsage(prompt_tokens=len(prompt), completion_tokens=0))
        g = self.sampling(request)
        gens = await asyncio.gather(*(self.batcher.generate(prompt, g, (self.episode, call, i), vision=vision)
                                      for i in range(request.n)))
        gens = capped(gens, [min(int(g.max_new_tokens), limit - len(prompt))] * len(gens))  # whatever the engine
        if self.closed:  # the episode ended while this call was sampled: nothing of it is trained
            raise RequestError(409, "this episode has ended; its client cannot be used any more.")
        choices = []
        self.counters.truncated += sum(bool(gen.truncated) for gen in gens)
        for i, gen in enumerate(gens):
            self.records.append(CallRecord(cid, i, call, list(prompt), list(gen.output_ids), list(gen.logprobs),
                                           list(gen.versions), bool(gen.truncated), vision=vision))
            choices.append(self._choice(i, gen, request))
        if self.concat and vision is None:  # what a later call may continue: these messages, then one of these answers
            self.rendered.append(RenderedCall([template_message(m.to_dict()) for m in request.messages],
                                              request.tools, prompt))
            for choice, gen in zip(choices, gens):
                self.rendered[-1].add_answer(choice.message.content, choice.message.tool_calls, gen.output_ids,
                                             gen.truncated)
        return ChatCompletion(id=cid, model=request.model or self.model_name, choices=choices,
                              usage=CompletionUsage(prompt_tokens=len(prompt),  # once for all n, as OpenAI counts
                                                    completion_tokens=sum(len(x.output_ids) for x in gens)))

    def _choice(self, index: int, gen, request: ChatRequest) -> Choice:
        text = self.tokenizer.decode(gen.output_ids, skip_special_tokens=True)
        calls = []
        if request.tools and request.tool_choice != "none":
            parsed = self.parser.parse(text)
            self.counters.tool_parse_failures += parsed.failed
            self.counters.tool_calls += len(parsed.tool_calls)  # whoever runs them: the agent or call_tool
            text, calls = parsed.content, parsed.tool_calls
        finish = "tool_calls" if calls else ("length" if gen.truncated else "stop")
        tool_calls = [ChatCompletionMessageToolCall(id=c.id, function=Function(name=c.name, arguments=c.arguments))
                      for c in calls] or None
        return Choice(index=index, message=ChatCompletionMessage(content=text, tool_calls=tool_calls),
                      finish_reason=finish)

    # -- rewards and tools ------------------------------------------------------------------------
    def set_reward_now(self, completion_id: str | None, reward: Any) -> None:
        """Give the call ``completion_id`` (None: the latest call) the reward ``reward``."""
        try:
            self._set_reward(completion_id, reward)
        except RequestError as e:
            self.bad_request(e)
            raise

    def _set_reward(self, completion_id: str | None, reward: Any) -> None:
        if self.closed:
            raise RequestError(409, "this episode has ended; its rewards cannot be changed any more.")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not fits_float32(reward):
            raise RequestError(400, f"reward must be a finite number within float32, got {reward!r:.80}.",
                               param="reward")
        if completion_id is None:
            if not self.records:
                raise RequestError(404, "this episode has made no call yet, so there is no call to reward.")
            completion_id = self.records[-1].completion_id
        mine = [r for r in self.records if r.completion_id == completion_id]
        if not mine:
            raise RequestError(404, f"no call of this episode has the id {completion_id!r}.", param="completion_id")
        for r in mine:
            r.reward = float(reward)

    async def set_reward(self, completion_id: str | None, reward: float) -> None:
        """The ``ChatHandler`` method of :meth:`set_reward_now`."""
        self.set_reward_now(completion_id, reward)

    async def call_tool(self, tool_call: Any, tools: Sequence[Any], *, timeout: float | None = None) -> dict:
        """Run the tool a call names on its arguments, for at most ``timeout`` seconds (None: the tool kind's
        limit); the ``role: tool`` message of its result (an error text when the tool is unknown, the arguments
        are bad, the tool raises or runs out of time, each counted)."""
        fn = tool_call["function"] if isinstance(tool_call, dict) else tool_call.function
        name = fn["name"] if isinstance(fn, dict) else fn.name
        arguments = fn["arguments"] if isinstance(fn, dict) else fn.arguments
        call_id = tool_call["id"] if isinstance(tool_call, dict) else tool_call.id
        by_name = {t.name: t for t in (as_tool(t) for t in tools)}
        self.counters.tool_runs += 1
        if name not in by_name:
            self.counters.tool_errors += 1
            content = f"Error: there is no tool {name!r}; the tools are {', '.join(sorted(by_name)) or 'none'}."
        else:
            limit = self.tool_policy.timeout if timeout is None else timeout
            result = await arun_tool(by_name[name], arguments, timeout=limit)
            if result.ended:
                self.counters.tool_timeouts += 1
                self.counters.tool_abandoned += result.ended == "abandoned"
                self.tool_overruns.setdefault(result.ended, f"{name!r} {result.ended} after {limit:g} s")
            else:
                self.counters.tool_errors += not result.ok
            content = result.content
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def as_tool(obj: Any) -> Tool:
    """A ``Tool`` from a ``Tool``, a Python function, or an OpenAI schema dict."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, dict):
        return tool_from_openai(obj)
    if callable(obj):
        return tool_from_function(obj)
    raise TypeError(f"a tool must be a Tool, a function or an OpenAI schema dict, got {type(obj).__name__}")
