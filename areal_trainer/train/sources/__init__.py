"""Where a step's trajectory groups come from: ``build.py`` (the :class:`RolloutSource` protocol, the
synchronous source and the choice among them), ``concurrent.py`` (a rollout thread bounded by the
staleness manager), ``lagged.py`` (seeded lagging snapshots), ``collect.py`` (groups -> a batch).
"""
