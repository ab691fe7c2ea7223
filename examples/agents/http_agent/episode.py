"""The HTTP agent example's episodes, in a process of their own that knows nothing of the trainer.

Two ways to run it, the same episode logic in both: it asks the row's question; if the final number of
the answer is wrong it says so and asks once more (at most ``MAX_CALLS`` calls); the reward is 1.0 when
the final answer is right, else 0.0.

* ``python -m examples.agents.http_agent.episode``: one episode. The dataset row comes as JSON on stdin,
  the endpoint and the episode's key from ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (read by the
  ``openai`` package's blocking client); the last line printed is the reward.

      echo '{"messages": [...], "answer": "3 + 4 = 7\\n#### 7"}' | \\
          OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=sk-... python -m examples.agents.http_agent.episode

* ``python -m examples.agents.http_agent.episode --serve``: many episodes at once, for as long as stdin
  is open. Each stdin line is a JSON request ``{"id", "base_url", "api_key", "row"}`` (an episode) or
  ``{"cancel": id}``; each episode runs as an asyncio task with the ``openai`` package's async client (on
  aiohttp when ``openai[aiohttp]`` is installed) and its own key, and ends with one stdout line
  ``{"id", "reward"}`` or ``{"id", "error"}``. A cancelled
  episode prints nothing. At the end of stdin the episodes still running are cancelled.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading

import openai

MAX_CALLS = 2
FEEDBACK = "Your answer is incorrect. Please try again."


def final_number(text: str | None) -> str | None:
    """The number after the last ``####`` (the task's answer format), else the last number."""
    text = text or ""
    tail = text.rsplit("####", 1)[-1] if "####" in text else text
    found = re.findall(r"-?\d+", tail)
    return found[-1] if found else None


def _target(data: dict) -> str | None:
    return final_number(str(data["answer"]).split("####")[-1])


def _retry(messages: list[dict], answer: str) -> list[dict]:
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": FEEDBACK}]


def solve(data: dict, client: openai.OpenAI) -> float:
    target, messages = _target(data), list(data["messages"])
    for _ in range(MAX_CALLS):
        r = client.chat.completions.create(model="policy", messages=messages)
        answer = r.choices[0].message.content or ""
        if target is not None and final_number(answer) == target:
            return 1.0
        messages = _retry(messages, answer)
    return 0.0


async def solve_async(data: dict, client: openai.AsyncOpenAI) -> float:
    """:func:`solve` with the async client."""
    target, messages = _target(data), list(data["messages"])
    for _ in range(MAX_CALLS):
        r = await client.chat.completions.create(model="policy", messages=messages)
        answer = r.choices[0].message.content or ""
        if target is not None and final_number(answer) == target:
            return 1.0
        messages = _retry(messages, answer)
    return 0.0


def main() -> None:
    data = json.load(sys.stdin)
    # No retries: every request is sampled and recorded for training, so a retried request that the
    # server is still answering would be sampled, and trained on, twice.
    with openai.OpenAI(max_retries=0) as client:
        reward = solve(data, client)
    print(reward, flush=True)


def _describe(e: BaseException) -> str:
    """``Type: message``, with the exceptions it was raised from (the transport's, under a connection error)."""
    parts = []
    while e is not None and len(parts) < 4:
        parts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)


def _transport() -> dict:
    """aiohttp when the ``openai`` package's aiohttp extra is installed: its default transport (httpx) checks
    every pooled connection on each request, about 10 ms a request with 64 episodes in flight."""
    try:
        return {"http_client": openai.DefaultAioHttpClient()}
    except RuntimeError:  # pip install "openai[aiohttp]"
        return {}


class _Serving:
    """The episodes of ``--serve``: one async client per endpoint, one task per episode."""

    def __init__(self, out):
        self.out = out
        self.clients: dict[str, openai.AsyncOpenAI] = {}
        self.tasks: dict[int, asyncio.Task] = {}

    def client(self, base_url: str, api_key: str) -> openai.AsyncOpenAI:
        # One connection pool per endpoint; each episode sends its own key (with_options shares the pool).
        if base_url not in self.clients:
            self.clients[base_url] = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                                        **_transport())
        return self.clients[base_url].with_options(api_key=api_key)

    def handle(self, line: str) -> None:
        msg = json.loads(line)
        if "cancel" in msg:
            task = self.tasks.get(msg["cancel"])
            if task is not None:
                task.cancel()
            return
        self.tasks[msg["id"]] = asyncio.ensure_future(self.episode(msg["id"], msg["base_url"], msg["api_key"],
                                                                   msg["row"]))

    async def episode(self, n: int, base_url: str, api_key: str, row: dict) -> None:
        try:
            out = {"id": n, "reward": await solve_async(row, self.client(base_url, api_key))}
        except asyncio.CancelledError:
            return
        except Exception as e:  # noqa: BLE001 - reported to the trainer as this episode's error
            out = {"id": n, "error": _describe(e)}
        finally:
            self.tasks.pop(n, None)
        self.out.write(json.dumps(out) + "\n")
        self.out.flush()

    async def close(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for client in self.clients.values():
            await client.close()


async def serve(stdin=None, stdout=None) -> None:
    """Run the episodes that ``stdin`` asks for until it ends (see the module docstring)."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    loop, lines = asyncio.get_running_loop(), asyncio.Queue()

    def read() -> None:  # a blocking read of stdin, off the event loop
        for line in stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()
    serving = _Serving(stdout)
    try:
        while (line := await lines.get()) is not None:
            if line.strip():
                serving.handle(line)
    finally:
        await serving.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        asyncio.run(serve())
    else:
        main()
