"""An environment module in the shape verifiers had before 0.4: a module-level ``load_environment`` returning
an environment built from ``vf.SingleTurnEnv`` (gone from verifiers 0.4, so never called here)."""


def load_environment(**kwargs):
    import verifiers as vf

    return vf.SingleTurnEnv(**kwargs)
