"""The calculator agent written against the ``openai`` package, in both forms of ``rollout.agent``.

``agent.py`` uses the trainer's client and its ``call_tool``. This one is written as for any OpenAI
endpoint: it sends the tool's JSON schema, reads ``message.tool_calls``, runs ``calc`` itself and sends
the result back as a ``role: tool`` message. It runs in either form, with the same rows from the same
seed (``tests/rollout/test_agent_forms.py``):

* ``run(data, *, client)``: in process, with the trainer's client;
* :class:`HTTPAgent`: ``run(data, *, base_url, api_key)``, over the run's HTTP endpoint with
  ``openai.AsyncOpenAI``. The client is built once, at the first episode, and each episode takes its own
  key with ``with_options`` (which shares the connection pool); ``close()`` closes it when the run ends.
  Building an ``openai.AsyncOpenAI`` costs 20 ms or more of CPU (its TLS setup), in every episode if
  done there: :func:`run_new_client` does that, for comparison (``scripts/bench_agents.py``).
  The client sends through aiohttp (the ``openai`` package's ``DefaultAioHttpClient``, installed by
  ``pip install "openai[aiohttp]"``): its default transport, httpx, checks every pooled connection on
  each request, which with 64 episodes in flight costs about 10 ms a request (docs/agents_http.md).
  :class:`HTTPxAgent` is the same agent on the default transport, for comparison. With
  ``rollout.agent_processes=2`` its episodes run in two processes of their own, where the package's work
  per request runs beside the trainer's instead of on its event loop (docs/agents_http.md).
* :class:`JSONAgent`: the same requests over HTTP without the ``openai`` package, posted as JSON with one
  ``aiohttp`` session, for comparison: the package's own work on each request (typing the parameters,
  building the request, parsing the reply into its types) is left out, so the difference to the in-process
  form is what the endpoint costs (``scripts/bench_agents.py``).

    python -m areal_trainer --config-dir examples/agents/calculator --config-name calculator \\
        rollout.agent=examples.agents.calculator.openai_agent.HTTPAgent
"""

from __future__ import annotations

import json
import warnings

from .agent import calc, final_answer

CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression of integers with + - * /.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
MAX_TURNS = 3


def run_calc(arguments: str) -> str:
    """The tool on a call's JSON arguments; its error text when it fails (the model sees it)."""
    try:
        return calc(**json.loads(arguments))
    except Exception as e:  # noqa: BLE001 - the model reads the error, as from any tool
        return f"Error: {type(e).__name__}: {e}"


async def solve(data, client, max_turns: int = MAX_TURNS) -> float:
    """One episode with any ``openai.AsyncOpenAI``-like client: 1.0 when the final ``#### N`` is the answer."""
    messages = list(data["messages"])
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = final_answer(message.content)
            return float(answer is not None and answer == final_answer(data["answer"]))
        messages.append(message)
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_calc(call.function.arguments)})
    return 0.0


async def run(data, *, client):
    """In process: the trainer's client."""
    return await solve(data, client)


def async_client(base_url: str, api_key: str, *, aiohttp: bool = True):
    """An ``openai.AsyncOpenAI`` without retries (a retried request would be sampled and trained twice), on
    aiohttp when ``aiohttp`` and the package's aiohttp extra is installed (else on httpx, with a warning)."""
    import openai

    extra = {}
    if aiohttp:
        try:
            extra["http_client"] = openai.DefaultAioHttpClient()
        except RuntimeError as e:  # the extra is missing: httpx works, slower with many episodes in flight
            warnings.warn(f"{e}; using httpx, which costs about 10 ms a request with 64 episodes in flight "
                          '(pip install "openai[aiohttp]")', stacklevel=2)
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, **extra)


class HTTPAgent:
    """Over the run's HTTP endpoint, with one ``openai.AsyncOpenAI`` (on aiohttp) for the whole run."""

    aiohttp = True

    def __init__(self):
        self.client = None

    async def run(self, data, *, base_url, api_key):
        if self.client is None:
            self.client = async_client(base_url, api_key, aiohttp=self.aiohttp)
        return await solve(data, self.client.with_options(base_url=base_url, api_key=api_key))

    async def close(self):
        """Called once when the run ends, on the loop the episodes ran on."""
        if self.client is not None:
            await self.client.close()


class HTTPxAgent(HTTPAgent):
    """:class:`HTTPAgent` on the ``openai`` package's default transport (httpx)."""

    aiohttp = False


async def run_new_client(data, *, base_url, api_key):
    """Over HTTP with a new client in every episode (slower: see the module docstring)."""
    async with async_client(base_url, api_key) as client:
        return await solve(data, client)


class JSONAgent:
    """Over the run's HTTP endpoint, posting the requests as JSON with one ``aiohttp`` session for the run."""

    def __init__(self):
        self.session = None

    async def run(self, data, *, base_url, api_key):
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession()
        return await solve(data, _JSONClient(self.session, base_url, api_key))

    async def close(self):
        if self.session is not None:
            await self.session.close()


class _JSONClient:
    """Just enough of ``openai.AsyncOpenAI`` for :func:`solve`: ``chat.completions.create(**body)``."""

    def __init__(self, session, base_url: str, api_key: str):
        self.chat = self.completions = self
        self._session, self._url = session, base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"}

    async def create(self, **body):
        async with self._session.post(self._url, json=body, headers=self._headers) as response:
            reply = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{self._url}: {response.status} {reply}")
        return _fields(reply)


class _Fields(dict):
    """A JSON object whose fields also read as attributes, as the ``openai`` package's types do (a field left
    out reads as None, as their optional fields do); sent back as JSON unchanged (an assistant message
    appended to the conversation)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _fields(self.get(name))


def _fields(value):
    if isinstance(value, dict):
        return _Fields(value)
    return [_fields(v) for v in value] if isinstance(value, list) else value
