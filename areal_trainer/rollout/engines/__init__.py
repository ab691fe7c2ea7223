"""Inference engines: what turns prompt ids into sampled ids with their log-probs.

``hf.py`` (transformers ``generate``, interruptible, shared-prefix prefill), ``vllm.py`` (a colocated
vLLM engine), ``backends.py`` (``rollout.backend`` -> an engine), ``batcher.py`` (one generation batch out
of many concurrent requests), ``weights.py`` (copies and snapshots of the policy, and the gate that lets
the trainer update an engine's weights mid-rollout), ``stops.py`` (stop strings).
Engines know nothing of agents or workflows.
"""
