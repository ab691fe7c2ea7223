"""Collect one training batch of trajectory groups, applying the dynamic-sampling filter.

Fixed batch size (default): keep sampling new prompts until ``batch_size`` groups are accepted,
for at most ``rollout.max_sampling_rounds`` rounds, then fail with a clear error.
``dynamic_bs=true``: train on what the first round accepted (another round only if it accepted
nothing), so the batch size varies; if no round accepted anything the step is skipped (an empty
list is returned) rather than failing the run.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UserError


def collect_groups(loader, workflow, gconfig, *, batch_size: int, accept: Callable | None, dynamic_bs: bool,
                   max_rounds: int, world_size: int = 1, reduce_max: Callable[[int], int] = lambda x: x
                   ) -> tuple[list[dict], dict[str, float]]:
    """(accepted groups, metrics about filtering).

    With several processes ``batch_size`` is this process's share and ``reduce_max`` takes the
    maximum over processes, so that all of them run the same rounds and draw the same number of
    prompts from the (shared-order) loader: no prompt is used twice.
    """
    accepted: list[dict] = []
    attempted, reward_sum, reward_n = 0, 0.0, 0
    for _ in range(max_rounds):
        want = batch_size if (dynamic_bs or accept is None) else reduce_max(batch_size - len(accepted))
        samples = loader.take(want * world_size)
        groups = workflow.rollout(samples, gconfig)
        attempted += len(groups)
        for g in groups:
            reward_sum, reward_n = reward_sum + float(g["rewards"].sum()), reward_n + g["rewards"].numel()
        accepted += [g for g in groups if accept is None or accept(g)]
        short = batch_size - len(accepted) if not dynamic_bs else int(not accepted)
        if accept is None or reduce_max(short) <= 0:
            break
    else:
        if not dynamic_bs:
            raise UserError(
                f"rollout.dynamic_filter accepted only {len(accepted)} of {attempted} prompt groups in "
                f"rollout.max_sampling_rounds={max_rounds} rounds (needed {batch_size}). Raise "
                "rollout.max_sampling_rounds or gconfig.n_samples, set dynamic_bs=true, or loosen the filter.")
    accepted = accepted[:batch_size] if not dynamic_bs else accepted
    if dynamic_bs and reduce_max(int(not accepted)) > 0:
        accepted = []  # some process has nothing to train on: every process skips this step together
    return accepted, {"rollout/accepted_groups": len(accepted), "rollout/sampled_groups": attempted,
                      "rollout/accept_rate": len(accepted) / max(attempted, 1),
                      "reward/sampled": reward_sum / max(reward_n, 1)}

