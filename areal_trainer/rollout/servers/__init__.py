"""Inference servers: the rollout engine in processes of its own, which the trainer starts or finds, samples on
over HTTP and pushes its weights to (``rollout.backend=<engine>:d<N>p1t<T>``, ``rollout.server_addrs``).

* ``app.py`` and ``__main__.py``: the server (``python -m areal_trainer.rollout.servers``), an engine behind routes;
* ``protocol.py``: what travels (token ids, log-probs, versions);
* ``client.py``: :class:`ServerEngine`, the trainer's engine over the servers (spreading, seeds, retries);
* ``weights.py`` and ``group.py``: pushing weights by disk or by a collective group;
* ``fleet.py``: the servers a run starts, and their end with it;
* ``spec.py``: the backend's entry in the engine registry, bound once from the configuration.
"""
