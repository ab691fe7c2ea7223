"""A verifiers task with tools, as an agent episode: its MCP tool servers run in this process, the chat loop is
driven here over the run's client, and the task scores the conversation.

Tool servers. The taskset's servers (``Taskset.toolsets``) are built and set up once and shared by every
episode, as verifiers shares them; a task's own (``Task.toolsets``) are built per episode, set up for its task
(``setup``, ``setup_task``) and closed when it ends. Each server's ``@vf.tool`` methods are registered on an
in-process ``MCPServer`` and called through it, so arguments are validated by the tool's own schema; the model
sees them as ``<server>_<tool>`` (bare names for ``TOOL_PREFIX = None``), as verifiers names them.

The loop. The task's prompt and the tools' schemas go to ``client.chat.completions.create``; each tool call of
the answer runs (``client.call_tool``: an unknown tool, arguments that do not fit or a tool that raises give the
model the error text, counted in ``agent/tool_errors``); the loop ends at an answer without tool calls or after
``environment.max_turns`` calls (then counted in ``env/turn_limits``). The conversation, as the model saw it,
is then scored by the task (``verifiers_env.score_conversation``); the score is the episode's reward.
"""

from __future__ import annotations

from typing import Any

from ..rollout.agents.tools import tool_from_openai
from .base import EnvironmentFailure, Score, describe, warn_once
from .verifiers_score import score_conversation


class ToolServers:
    """The tool servers of an episode, each registered on an in-process MCP server; ``tools`` as agent tools."""

    def __init__(self, label: str):
        self.label = label
        self.tools: list = []
        self._owned: list = []

    async def add(self, server: Any, task: Any | None, *, owned: bool) -> None:
        from mcp.server.mcpserver import MCPServer

        try:
            await server.setup()
            if task is not None:
                await server.setup_task(task)
            mcp = MCPServer(server.server_name or type(server).__name__)
            server.register(mcp)
            listed = await mcp.list_tools()
        except Exception as e:  # noqa: BLE001 - the server's own code
            raise EnvironmentFailure("setup", f"tool server {type(server).__name__} failed to start: "
                                              f"{describe(e)}") from e
        if owned:
            self._owned.append(server)
        prefix = server.server_name
        for tool in listed:
            name = f"{prefix}_{tool.name}" if prefix else tool.name
            schema = {"name": name, "description": tool.description or "", "parameters": tool.input_schema}
            self.tools.append(tool_from_openai(schema, fn=self._caller(mcp, tool.name, name)))

    def _caller(self, mcp: Any, raw: str, name: str):
        label = self.label

        async def call(**arguments: Any) -> str:
            try:
                result = await mcp.call_tool(raw, arguments)
            except Exception as e:
                warn_once(label, f"tool:{name}", f"its tool {name!r} raised {describe(e)}; the model sees the error "
                                                 "text as the tool's result (counted in agent/tool_errors).")
                raise
            text = "\n".join(getattr(b, "text", str(b)) for b in getattr(result, "content", []) or [])
            if getattr(result, "is_error", False):
                raise RuntimeError(text or f"tool {name} failed")
            return text

        return call

    async def close(self) -> None:
        for server in self._owned:
            try:
                await server._exit_stack.aclose()  # what setup() entered, as verifiers' own server closes it
            except Exception as e:  # noqa: BLE001 - the episode is over; its score stands
                warn_once(self.label, "close", f"closing a tool server raised {describe(e)}")


async def tool_episode(env: Any, task: Any, client: Any, record: Any) -> float:
    """One episode of a task with tools (see the module docstring); its reward."""
    servers = ToolServers(env.label)
    try:
        servers.tools += await env.shared_tools()
        for server in env.task_cls.toolsets(task.config):
            await servers.add(server, task, owned=True)
        prompt = env.prompt(task)
        messages = [dict(m) for m in prompt]
        schemas = [t.to_openai() for t in servers.tools]
        stop = None
        for turn in range(env.settings.max_turns):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=schemas or None)
            message = reply.choices[0].message
            messages.append(_assistant(message))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append(await client.call_tool(call, servers.tools))
            if turn == env.settings.max_turns - 1:
                stop = "max_turns"
                record.turn_limit = True
        score: Score = await score_conversation(task, messages, sampled_from=len(prompt), stop=stop)
        record.parts = score.parts
        return score.reward
    finally:
        await servers.close()


def _assistant(message: Any) -> dict:
    """The answer as a chat message to send back and to score: its content and its tool calls."""
    out: dict = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in message.tool_calls]
    return out
