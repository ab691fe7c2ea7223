"""Python-function problems with unit tests, scored by ``areal_trainer.reward.code.unit_tests`` (see README.md)."""
