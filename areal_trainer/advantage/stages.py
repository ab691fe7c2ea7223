"""The built-in stages, with what each declares about itself, and the bound computation.

Binding a configuration to stages (built-in names, import paths, kwargs, the rules) happens once at
start-up in ``components/advantage.py``; this module only offers what the maths provides:

* ``BUILTINS``: per stage, the built-in functions by name, each as a :class:`Builtin` that says what
  the pipeline may assume of it (``reads_turn_ids``, ``takes_prm_params``). ``auto`` is each stage's
  default and is not listed;
* :class:`AdvantageFn`: the bound computation; a call checks the rollout batch, leaves it untouched,
  validates what a user function returns, and runs on ``ADVANTAGE_THREADS`` intra-op threads
  (``threads.py`` says why).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import PluginOutputError
from .datatypes import AdvantageInputs, AdvantageResult
from .estimators import token_gae, turn_gae
from .pipeline import Stages, check_data
from .process import PROCESS_FUNCTIONS
from .reward import identity
from .threads import ADVANTAGE_THREADS, intra_op_threads
from .validation import check_result, check_unmodified, tensor_versions


@dataclass(frozen=True)
class Builtin:
    """A built-in stage function and what it declares (see :class:`~.pipeline.Stage`)."""

    fn: Callable
    reads_turn_ids: bool = True
    takes_prm_params: bool = False


BUILTINS: dict[str, dict[str, Builtin]] = {
    "outcome_reward_shaping": {"identity": Builtin(identity)},
    "estimator": {"token_gae": Builtin(token_gae, reads_turn_ids=False), "turn_gae": Builtin(turn_gae)},
    "process_adv_shaping": {name: Builtin(fn, takes_prm_params=name == "gvpo")
                            for name, fn in PROCESS_FUNCTIONS.items()},
    "group_baseline": {},
}
"""Built-in functions by stage; user functions come by import path."""


class AdvantageFn:
    """The bound computation: call it with ``AdvantageInputs``; the result is validated."""

    def __init__(self, run: Callable[[AdvantageInputs], AdvantageResult], label: str, stages: Stages | None,
                 *, threads: int | None = ADVANTAGE_THREADS):
        self._run = run
        self.label = label
        self.stages = stages
        """The default pipeline's stages and settings; None for a full replacement (``compute``)."""
        self.threads = threads
        """Torch intra-op threads of a call, the caller's count restored after it; None: the caller's."""

    def __call__(self, inputs: AdvantageInputs) -> AdvantageResult:
        with intra_op_threads(self.threads):
            return self._checked(inputs)

    def _checked(self, inputs: AdvantageInputs) -> AdvantageResult:
        n_rows, width, device = check_data(inputs.data, inputs.meta)
        before = tensor_versions(inputs.data)
        result = self._run(inputs)
        check_unmodified(self.label, inputs.data, before)
        check_result(result, label=self.label, shape=(n_rows, width), device=device, trusted=self.stages is not None)
        if inputs.mopd and "mopd_behavior_logprobs" not in result.extras:
            raise PluginOutputError(
                f"{self.label}: MOPD is on (teacher), so the result must carry extras['mopd_behavior_logprobs']: the "
                "rollout's logprobs rolled left by one and masked, detached (areal_trainer.advantage.distill."
                "mopd_behavior_logprobs(inputs.data, loss_mask)); MOPD's IS weight is taken against them.")
        return result

    def __repr__(self) -> str:
        return f"AdvantageFn({self.label})"
