"""Plugins for the end-to-end tests."""


def digit_share_reward(prompt: str, completion: str, answer: str) -> float:
    """The share of digits in the completion: varies between the answers of an untrained model, so every
    group has a reward signal (the task reward is 0 for almost all of them)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)
