"""What the progress bar shows after each step: the step's reward (pure distillation: its reverse KL to
the teacher, as it calls no reward) and the latest held-out accuracy, or, for a run without a verifier,
the latest held-out mean reward; for agent runs also the step's share of tool calls the parser could not
read (``tool_fail``) and of answers cut at the token budget (``cut``)."""

from __future__ import annotations

from .health import rates

LIVE = {"reward": ("reward", ("reward/task", "reward/sampled")), "kl": ("kl", ("distill/reverse_kl",))}
"""The bar's first entry: its name and the step's metrics it reads, the first one present."""


class ProgressPostfix:
    """Builds the bar's postfix. An evaluation runs only every ``evaluator.freq_steps`` steps, so its result
    is remembered and shown on the steps in between (and after a resume, from the metrics file) rather than
    vanishing the step after it was measured: ``acc`` when it reported an accuracy, else ``eval_reward``
    (never a number called accuracy that is not one). ``live``: ``reward`` or ``kl`` (see :data:`LIVE`)."""

    def __init__(self, records: list[dict] | None = None, *, live: str = "reward"):
        self.live = LIVE[live]
        self.held_out: tuple[str, float] | None = None
        for r in records or ():
            self.update(r)

    def update(self, metrics: dict) -> None:
        if "eval/accuracy" in metrics:
            self.held_out = ("acc", float(metrics["eval/accuracy"]))
        elif "eval/reward" in metrics:
            self.held_out = ("eval_reward", float(metrics["eval/reward"]))

    def __call__(self, metrics: dict) -> dict[str, str]:
        """The postfix for a step's ``metrics`` (the live value first, then the held-out one once there is one)."""
        self.update(metrics)
        # A step with nothing to train on has only the reward of what it sampled (and rejected).
        name, keys = self.live
        value = next((metrics[k] for k in keys if k in metrics), float("nan"))
        out = {name: f"{value:.3f}"}
        if self.held_out is not None:
            out[self.held_out[0]] = f"{self.held_out[1]:.3f}"
        out.update((k, f"{v:.0%}") for k, v in rates(metrics).items())
        return out
