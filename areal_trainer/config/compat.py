"""AReaL keys that are accepted for compatibility but do not act here, and what happens to them.

Every key of the schema either acts, or is listed here: rejected with a message saying what to use
instead when a value asks for something this trainer does not do (the rule lives in the key's
``check``), or, when ignoring it is harmless, named in one warning at start-up when it is set to
anything but its default. ``tests/config/test_keys.py`` checks that no key is left silent.
"""

from __future__ import annotations

import dataclasses

from .keys import defaults, value_at

REJECTED = {
    "*.mb_spec.packing_algorithm": "only 'ffd' (the default) is implemented; 'kk' is an error",
    "*.is_critic": "must be false for actor/ref and true for critic (AReaL's rule); the critic is its own section",
    "train_dataset.type": "only 'rl'; 'sft' is an error that points to sft_warmup",
    "valid_dataset.type": "only 'rl'",
    "*.peft_type": "only 'lora' (the default); other PEFT methods are an error",
}
"""Keys whose other values are configuration errors (see each section's ``check``)."""

IGNORED = {
    "recover.retries": "a failed run is not restarted by the trainer; restart it with recover.mode=auto "
                       "(e.g. Slurm --requeue, torchrun --max-restarts)",
    "critic.mask_no_eos_with_zero": "it has no effect on the critic (as in AReaL); actor.mask_no_eos_with_zero "
                                    "zeroes the outcome reward of truncated rows",
    "critic.temperature": "values do not depend on a sampling temperature",
    "cluster.cluster_name": "it is a label in AReaL",
    "cluster.name_resolve": "processes meet through torch's rendezvous (scheduler.type=local, ray, slurm)",
}
"""Keys that are harmless to ignore, warned about when set to anything but their default."""

REF_READ = ("path", "dtype", "optimizer")
"""The only keys of the ``ref`` section the reference policy reads (``optimizer``: it is frozen either
way); its forwards use the actor's temperature, micro-batching and actor.enable_tree_training."""


def compat_warnings(cfg) -> list[str]:
    """One message per group of ignored keys that ``cfg`` (a ``TrainerConfig``) sets."""
    out = []
    for key, why in IGNORED.items():
        section, _, name = key.rpartition(".")
        node = value_at(cfg, section)
        if node is None:
            continue
        default = getattr(defaults(type(node)), name)
        if getattr(node, name) != default:
            out.append(f"{key}={getattr(node, name)!r} has no effect here: {why}.")
    if cfg.ref is not None:
        default = defaults(type(cfg.ref))
        unused = [f.name for f in dataclasses.fields(cfg.ref)
                  if f.name not in REF_READ and getattr(cfg.ref, f.name) != getattr(default, f.name)]
        if unused:
            shown = ", ".join(f"ref.{n}" for n in unused)
            out.append(f"{shown} {'is' if len(unused) == 1 else 'are'} not used: the reference policy reads only "
                       "ref.path and ref.dtype (its forwards use the actor's temperature and micro-batching).")
    return out
