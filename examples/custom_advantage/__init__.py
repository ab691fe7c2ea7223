"""User functions for ``actor.advantage``: an outcome stage and an estimator stage."""
