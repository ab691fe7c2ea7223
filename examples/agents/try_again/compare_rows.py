"""The try-again agent's rows against ``MultiTurnWorkflow``'s, token for token, on the same samples,
weights and random seed.

Both run on one ``hf`` engine over the built-in task's warm-started model (the cached warm start of
``python -m areal_trainer --config-name grpo``, computed when missing) with the training sampling
settings (``gconfig``). The workflow samples turn ``k`` of every episode in one call; the agent's
episodes run concurrently and their requests are batched in the same order, so both draw the same
random numbers for the first answers. Per episode it compares the workflow's row with the agent's
rows (``rollout.agent_export=concat``, ``rollout.turn_discount=0.9``): ids, loss mask, behaviour
log-probs and reward.

``--chat-template-type`` is the agent's ``rollout.chat_template_type``: ``concat`` (the example's, and the
default here) continues each call's sampled ids, as ``MultiTurnWorkflow`` does (it is this agent on the
same session), so every row is identical; ``hf`` re-renders the conversation with the template, whose
rows differ where the README says.

Two chat templates:

* ``built-in``: the built-in tokenizer as it is; answers stop with ``<eos>`` and the template closes a
  turn with ``<|im_end|>``;
* ``eos-closes-turns``: the same template closing every turn with ``<eos>``, as Qwen's closes turns
  with its EOS ``<|im_end|>``.

    .venv/bin/python examples/agents/try_again/compare_rows.py [--prompts 32] [--seed 1] [--chat-template-type hf]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

AGENT = "examples.agents.try_again.agent.run"
DISCOUNT = 0.9


def rows_of(group) -> list[dict]:
    """Each row of a group as plain lists (its real tokens only)."""
    out = []
    for i in range(group["input_ids"].shape[0]):
        n = int(group["attention_mask"][i].sum())
        out.append({"ids": group["input_ids"][i, :n].tolist(), "mask": group["loss_mask"][i, :n].tolist(),
                    "logprobs": group["logprobs"][i, :n].tolist(), "reward": float(group["rewards"][i])})
    return out


def episodes_of(group) -> list[list[dict]]:
    rows, counts = rows_of(group), group.episode_rows or (1,) * group["input_ids"].shape[0]
    out, k = [], 0
    for c in counts:
        out.append(rows[k:k + c])
        k += c
    return out


def same_row(a: dict, b: dict) -> bool:
    return a["ids"] == b["ids"] and a["mask"] == b["mask"] and \
        max((abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])), default=0.0) < 1e-5


def first_answer(row: dict) -> list[int]:
    """The ids of a row's first trained span (its first answer)."""
    start = row["mask"].index(1)
    end = next((k for k in range(start, len(row["mask"])) if not row["mask"][k]), len(row["mask"]))
    return row["ids"][start:end]


def compare(name: str, tok, trainer, samples, args) -> None:
    import torch

    from areal_trainer.rollout.agents.multi_turn import MultiTurnWorkflow
    from areal_trainer.rollout.agents.spec import load_agent
    from areal_trainer.rollout.agents.workflow import AgentWorkflow
    from areal_trainer.rollout.engines.hf import HFEngine

    engine = HFEngine(trainer.policy.model, tok, device=trainer.device)
    g = trainer.cfg.gconfig
    workflow = MultiTurnWorkflow(engine=engine, tokenizer=tok, reward=trainer.reward, max_turns=2,
                                 turn_discount=DISCOUNT)
    agent = AgentWorkflow(engine=engine, tokenizer=tok, reward=trainer.reward, agent=load_agent(AGENT, {}),
                          failures=trainer.reward.failures, export="concat",
                          chat_template_type=args.chat_template_type, turn_discount=DISCOUNT)
    torch.manual_seed(args.seed)
    by_workflow = [ep for grp in workflow.rollout(samples, g) for ep in episodes_of(grp)]
    torch.manual_seed(args.seed)
    groups = agent.rollout(samples, g)
    by_agent = [ep for grp in groups for ep in episodes_of(grp)]
    fallbacks = sum(grp.stats["agent/concat_fallbacks"].value for grp in groups)
    tally: Counter = Counter()
    example = None
    for (w,), a, grp_reward in zip(by_workflow, by_agent, [r for grp in groups for r in grp.episode_rewards]):
        turns = sum(1 for k in range(1, len(w["mask"])) if w["mask"][k] and not w["mask"][k - 1])
        tally[f"{turns} turn(s)"] += 1
        tally["first answer identical"] += first_answer(w) == first_answer(a[0])
        tally["reward identical"] += abs(w["reward"] - grp_reward) < 1e-6
        if len(a) == 1 and same_row(w, a[0]):
            tally[f"{turns} turn(s), row identical"] += 1
        elif example is None and turns == 2:
            example = (w, a)
    print(f"\n[{name}, chat_template_type={args.chat_template_type}] {len(by_workflow)} episodes; "
          f"agent/concat_fallbacks {fallbacks:.0f}")
    for key in sorted(tally):
        print(f"  {key}: {tally[key]}")
    if example is not None:
        w, a = example
        print("  a two-turn episode whose rows differ (special tokens shown; [...] = trained):")
        print("    workflow: " + render(tok, w))
        for k, row in enumerate(a):
            print(f"    agent {k}:  " + render(tok, row))


def render(tok, row: dict) -> str:
    """A row's text with its trained spans in brackets."""
    parts, k = [], 0
    while k < len(row["ids"]):
        j = k
        while j < len(row["ids"]) and row["mask"][j] == row["mask"][k]:
            j += 1
        text = tok.decode(row["ids"][k:j], skip_special_tokens=False).replace("\n", "\\n")
        parts.append(f"[{text}]" if row["mask"][k] else text)
        k = j
    return "".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=32, help="held-out prompts (each gconfig.n_samples episodes)")
    p.add_argument("--seed", type=int, default=1, help="the run's seed (its warm start) and the sampling seed")
    p.add_argument("--chat-template-type", default="concat", choices=("concat", "hf"),
                   help="the agent's rollout.chat_template_type")
    args = p.parse_args()

    from areal_trainer.components import load
    from areal_trainer.model.builtin import CHAT_TEMPLATE
    from areal_trainer.train.run import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(load("grpo", [f"seed={args.seed}", "stats_logger.progress_bar=false"]), tmp)
        trainer.warm_start()
        trainer.policy.model.eval()
        samples = trainer.valid_samples[:args.prompts]
        compare("built-in", trainer.tokenizer, trainer, samples, args)
        eos_turns = copy.deepcopy(trainer.tokenizer)
        eos_turns.chat_template = CHAT_TEMPLATE.replace("<|im_end|>", eos_turns.eos_token)
        compare("eos-closes-turns", eos_turns, trainer, samples, args)
        trainer.reward.close()


if __name__ == "__main__":
    main()
