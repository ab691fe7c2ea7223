"""Rewards: the reward functions' contract and their execution (``functions.py``, ``pool.py``,
``service.py``), reward models (``model.py``), scoring services (``remote.py``), code execution
(``code.py``) and the math answer checks (``math.py``)."""


def is_correct(rewards):
    """Whether each sample counts as correct: its reward is positive (the accuracy and pass@k of an
    evaluation, ``reward/correct_frac``). Works on numbers and tensors alike."""
    return rewards > 0


def completion_text(completion) -> str:
    """The text of a completion as reward functions receive it: a string as it is; for conversational
    rows (``[{"role": "assistant", "content": ...}, ...]``) the content of the last message."""
    if isinstance(completion, list):
        return str(completion[-1].get("content") or "") if completion else ""
    return completion or ""
