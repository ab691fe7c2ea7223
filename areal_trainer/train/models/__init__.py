"""The models a run trains or consults: ``policy.py`` and ``critic.py`` (each model with its adapter,
sharding, micro-batching and optimizer), ``build.py`` (the frozen reference and the critic, from the
policy as RL begins), ``logprobs.py`` (next-token log-probs and entropy), ``update.py`` (one optimizer
update over a batch), ``optim.py`` (optimizers and schedules), ``teacher.py`` (distillation teachers).
"""
