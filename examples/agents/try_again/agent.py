"""The multi-turn "try again" task of ``MultiTurnWorkflow`` as an agent: answer; while the final number
is wrong and turns remain, hear "Your answer is incorrect. Please try again." and answer again.
(``MultiTurnWorkflow``, ``areal_trainer/rollout/agents/multi_turn.py``, is this agent built in.)

The agent returns the last answer's reward, 1 or 0, from the run's own checker (``gsm8k_reward_fn``).
``rollout.turn_discount`` (0.9 in ``try_again.yaml``) gives the episode's first call ``0.9 * r`` when
the episode took two calls, so the episode's reward is ``r * 0.9 ** (turns - 1)``, the workflow's. With
``rollout.chat_template_type: concat`` its calls' ids are the workflow's token for token.
"""

from areal_trainer.reward.math import gsm8k_reward_fn

FEEDBACK = "Your answer is incorrect. Please try again."


async def run(data, *, client, max_turns: int = 2, feedback: str = FEEDBACK) -> float:
    messages = list(data["messages"])
    for turn in range(max_turns):
        r = await client.chat.completions.create(model="policy", messages=messages)
        answer = r.choices[0].message.content or ""
        reward = gsm8k_reward_fn(data.get("prompt"), answer, data.get("answer"))
        if reward > 0 or turn + 1 == max_turns:
            return reward
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": feedback}]
    return 0.0
