"""A calculator-tool agent on the built-in task (``builtin:arith``; README.md in this folder).

The model is offered one tool, ``calc``. Each time it answers with hermes tool calls, the agent runs them
and sends the results back as ``role: tool`` messages; at most ``max_turns`` model calls. The reward is
1.0 when the final answer's ``#### N`` is the row's answer, else 0.0. The trainer counts the tool calls
(``agent/tool_calls`` per step, ``eval/agent/tool_calls`` at evaluation), their errors and unreadable calls.
"""

from __future__ import annotations

import ast
import operator
import re

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_FINAL = re.compile(r"####\s*(-?\d+)")


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return -_value(node.operand) if isinstance(node.op, ast.USub) else _value(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        a, b = _value(node.left), _value(node.right)
        if b == 0 or a % b:
            raise ValueError(f"{a} / {b} is not a whole number")
        return a // b
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    what = node.op if isinstance(node, (ast.BinOp, ast.UnaryOp)) else node
    raise ValueError(f"only integers and + - * / are allowed, not {type(what).__name__}")


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with + - * /.

    Args:
        expression: the expression, e.g. "12 - 5".
    """
    if len(expression) > 200:
        raise ValueError("the expression is too long")
    return str(_value(ast.parse(expression, mode="eval").body))


def final_answer(text: str | None) -> str | None:
    found = _FINAL.findall(text or "")
    return found[-1] if found else None


async def run(data, *, client, max_turns: int = 3):
    """One episode: ask, run the tool calls, send their results, ask again."""
    messages = list(data["messages"])
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[calc])
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = final_answer(message.content)
            return float(answer is not None and answer == final_answer(data["answer"]))
        messages.append(message)
        for call in message.tool_calls:
            messages.append(await client.call_tool(call, [calc]))
    return 0.0
