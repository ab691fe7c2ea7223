"""Plugins for the end-to-end tests."""


def digit_share_reward(prompt: str, completion: str, answer: str) -> float:
    """The share of digits in the completion: varies between the answers of an untrained model, so every
    group has a reward signal (the task reward is 0 for almost all of them)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def reject_all(group) -> bool:
    """A dynamic filter that accepts no group: with dynamic_bs every step has nothing to train on."""
    return False


def hanging_reward(prompt: str, completion: str, answer: str) -> float:
    """A reward function that never returns (in practice: a stuck external verifier)."""
    import time

    time.sleep(3600)
    return 0.0


class NoRolloutWorkflow:
    """A workflow class without the protocol's ``rollout`` method."""

    def __init__(self, *, engine, tokenizer, reward):
        pass


class WrongRolloutWorkflow(NoRolloutWorkflow):
    """``rollout`` without the gconfig argument."""

    def rollout(self, samples):
        return []
