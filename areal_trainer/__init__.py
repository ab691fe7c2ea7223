"""areal_trainer: PPO-family reinforcement learning for language models, configured with Hydra.

The package follows the data flow of one training step:
``rollout`` (generate, reward) -> ``advantage`` -> ``loss`` -> ``train`` (update, checkpoint)
-> ``tracking`` (metrics, plots). ``config`` holds the typed schema.
"""

__version__ = "0.1.0"
