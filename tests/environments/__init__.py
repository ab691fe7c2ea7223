"""Environments written against the real packages (verifiers 0.4, reasoning-gym, Gymnasium, OpenEnv), for the
tests of ``areal_trainer/environments`` and of the command line with ``environment.type``. Their prompts are the
built-in task's words, so the built-in models can read them."""
