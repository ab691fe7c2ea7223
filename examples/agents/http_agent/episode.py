"""One episode of the HTTP agent example, in a process of its own: it knows nothing of the trainer.

It reads the dataset row as JSON on stdin and talks to the model with the ``openai`` package's
blocking client, which takes the endpoint and the episode's key from ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY``. It asks the row's question; if the final number of the answer is wrong it says
so and asks once more (at most ``MAX_CALLS`` calls). The last line it prints is the reward: 1.0 when
the final answer is right, else 0.0.

    echo '{"messages": [...], "answer": "3 + 4 = 7\\n#### 7"}' | \\
        OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=sk-... python -m examples.agents.http_agent.episode
"""

from __future__ import annotations

import json
import re
import sys

import openai

MAX_CALLS = 2
FEEDBACK = "Your answer is incorrect. Please try again."


def final_number(text: str | None) -> str | None:
    """The number after the last ``####`` (the task's answer format), else the last number."""
    text = text or ""
    tail = text.rsplit("####", 1)[-1] if "####" in text else text
    found = re.findall(r"-?\d+", tail)
    return found[-1] if found else None


def solve(data: dict, client: openai.OpenAI) -> float:
    target = final_number(str(data["answer"]).split("####")[-1])
    messages = list(data["messages"])
    for _ in range(MAX_CALLS):
        r = client.chat.completions.create(model="policy", messages=messages)
        answer = r.choices[0].message.content or ""
        if target is not None and final_number(answer) == target:
            return 1.0
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": FEEDBACK}]
    return 0.0


def main() -> None:
    data = json.load(sys.stdin)
    # No retries: every request is sampled and recorded for training, so a retried request that the
    # server is still answering would be sampled, and trained on, twice.
    with openai.OpenAI(max_retries=0) as client:
        reward = solve(data, client)
    print(reward, flush=True)


if __name__ == "__main__":
    main()
