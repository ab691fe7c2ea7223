"""Rewards: the reward functions' contract and their execution (``functions.py``, ``pool.py``,
``service.py``), reward models (``model.py``), scoring services (``remote.py``), code execution
(``code.py``) and the math answer checks (``math.py``)."""


def is_correct(rewards):
    """Whether each sample counts as correct: its reward is positive (the accuracy and pass@k of an
    evaluation, ``reward/correct_frac``). Works on numbers and tensors alike."""
    return rewards > 0
