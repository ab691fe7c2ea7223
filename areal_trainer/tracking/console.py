"""What the progress bar shows after each step: the step's reward and the latest held-out accuracy."""

from __future__ import annotations


class ProgressPostfix:
    """Builds the bar's postfix. An evaluation runs only every ``evaluator.freq_steps`` steps, so the
    accuracy is remembered and shown on the steps in between (and after a resume, from the metrics
    file) rather than vanishing the step after it was measured."""

    def __init__(self, records: list[dict] | None = None):
        self.acc: float | None = None
        for r in records or ():
            self.update(r)

    def update(self, metrics: dict) -> None:
        if "eval/accuracy" in metrics:
            self.acc = float(metrics["eval/accuracy"])

    def __call__(self, metrics: dict) -> dict[str, str]:
        """The postfix for a step's ``metrics`` (reward first, then the accuracy once there is one)."""
        self.update(metrics)
        # A step with nothing to train on has only the reward of what it sampled (and rejected).
        reward = metrics.get("reward/task", metrics.get("reward/sampled", float("nan")))
        out = {"reward": f"{reward:.3f}"}
        if self.acc is not None:
            out["acc"] = f"{self.acc:.3f}"
        return out
