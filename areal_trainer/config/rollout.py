"""How trajectories are produced: ``rollout`` (backend, workflow, agents, filtering, asynchronous training).
Key names and defaults follow AReaL's where AReaL has the key. How they are scored: ``reward.py``."""

from dataclasses import dataclass, field
from typing import Any

from ..dtypes import DTYPE_NAMES
from .base import Checked, at_least_one, fraction, integer_at_least, number_in, one_of

DEFAULT_WORKFLOW = "areal_trainer.rollout.workflows.single_turn.RLVRWorkflow"
AGENT_EXPORTS = ("individual", "concat")
"""``rollout/agents/trajectory.py::EXPORTS`` (``rollout.agent_export``), spelled without importing the agents
(``tests/config/test_light_checks.py`` fails when they differ)."""
AGENT_BATCHING = ("episodes", "eager")
"""``rollout/agents/workflow.py::BATCHING`` (``rollout.agent_batching``)."""


@dataclass
class RolloutConfig(Checked):
    """How trajectories are produced: the inference backend, the workflow, and group filtering."""

    backend: str = "hf"
    """The inference engine: ``hf`` (transformers generate, works everywhere) or ``vllm`` (optional extra), both in
    the trainer's processes (``rollout/engines/backends.py``); or ``<engine>:d<N>p1t<T>`` (e.g. ``vllm:d2p1t1``): N
    inference server processes beside the trainer, each with tensor parallelism T (``rollout/servers/``)."""
    server_addrs: list[str] = field(default_factory=list)
    """``host:port`` of inference servers started by hand (``python -m areal_trainer.rollout.servers``): the run
    samples on them and pushes its weights to them instead of starting its own."""
    setup_timeout: float = 300.0
    """Seconds the run waits for its inference servers to start (or to answer, with ``server_addrs``)."""
    request_retries: int = 3
    """How many times a generate request that failed on a server (refused, reset, timed out, 5xx) is sent again,
    to another server."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``enforce_eager``)."""
    workflow: str = DEFAULT_WORKFLOW
    """Import path of the workflow class that turns one prompt into trajectories."""
    workflow_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the workflow class (e.g. ``max_turns`` of the multi-turn workflow)."""
    dynamic_filter: str | None = None
    """Import path of ``fn(group) -> bool`` deciding whether a prompt's group is trained on
    (``areal_trainer.rollout.filters.has_reward_variance`` is DAPO's dynamic sampling)."""
    max_sampling_rounds: int = 8
    """With a filter and a fixed batch size: give up (with an error) after this many rounds of sampling."""
    generation_batch_size: int | None = None
    """Sequences per generate call (null: the whole step at once)."""
    # -- asynchronous, off-policy training (AReaL's names and defaults) ----------------------------
    max_head_offpolicyness: int = 0
    """eta: the most policy versions a trained token may lag behind the policy being trained. 0 =
    synchronous (generate, then train); > 0 = generation runs ahead of training (``offpolicy_mode``)."""
    offpolicy_mode: str = "concurrent"
    """How eta > 0 produces off-policy data. ``concurrent``: a rollout thread generates on its own copy of
    the policy while the trainer trains, admission bounded by AReaL's staleness manager. ``lagged``:
    reproducible, no concurrency; each prompt group is sampled by a policy snapshot lagging a seeded
    number of versions in [0, eta]."""
    lagged_switch_prob: float = 0.0
    """``lagged`` only: probability that a generation switches to a newer snapshot after a seeded number
    of tokens, as when a weight update lands mid-generation (its unfinished answers carry two versions)."""
    consumer_batch_size: int | None = None
    """Prompt groups the trainer consumes per version, the staleness manager's unit (null: train_dataset.batch_size,
    the only value that keeps the bound exact)."""
    max_concurrent_rollouts: int | None = None
    """Most prompt groups generating at once, i.e. per generation call (null: consumer_batch_size). With
    ``rollout.agent`` it also bounds the episodes in flight, to this many groups' episodes (null: all of a
    call's), and asynchronous training's default is (eta + 1) x the batch: everything the staleness bound
    admits, since a call of agent episodes lasts as long as its slowest one."""
    queue_size: int | None = None
    """Most prompt groups generated or generating but not yet trained on (null: 16 x max_concurrent_rollouts)."""
    partial_rollout: bool = True
    """On a weight update, interrupt the generation in flight at a token boundary and continue it under the
    new weights (each token keeps the version that sampled it); false: the update waits for it to finish."""
    dtype: str | None = None
    """Precision of the rollout's copy of the policy (null: the trainer's own weights and precision).
    ``bfloat16`` under float32 training gives the train/inference mismatch of bf16 inference engines."""
    request_timeout: float = 3600.0
    """Seconds the trainer waits for the rollout thread to finish a generation call before stopping the run; with
    inference servers also the most one request to a server may take (then it is retried on another)."""
    agent: str | None = None
    """Import path of the agent run once per episode in place of a workflow: an async function
    ``run(data, *, client)`` or ``run(data, *, base_url, api_key)``, or a class with such a ``run`` method. It
    returns the episode's reward, or ``{completion_id: reward}`` (``rollout/agents/workflow.py``, docs/agents.md)."""
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the agent class's constructor, or of every call of the agent function."""
    agent_processes: int = 0
    """Run an HTTP-form agent (``run(data, *, base_url, api_key)``) in this many processes of its own, which reach
    the run's endpoint as an agent elsewhere would: its Python work (the ``openai`` package's, its tools') runs
    beside the trainer's on other cores, and a crash ends only its process (counted in
    ``agent/process_restarts``). 0: on the trainer's event loop (``rollout/agents/processes.py``)."""
    agent_timeout: float | None = None
    """Seconds an episode may take; a longer one is cancelled (a plain ``def run`` is abandoned in its thread),
    scores ``reward.error_value`` and is counted in ``agent/timeouts`` (null: no limit)."""
    agent_export: str = "individual"
    """Rows of an agent episode: ``individual`` (each model call is a row) or ``concat`` (calls whose prompt
    extends the previous call's prompt and output exactly share one row)."""
    chat_template_type: str = "hf"
    """How an agent's call becomes prompt ids (AReaL's key): ``hf`` renders its messages whole with the chat
    template; ``concat`` continues the earlier call it extends (its messages, its answer, new messages) with
    that call's exact ids and the template's tokens for the new messages only, so nothing is re-tokenized
    and ``agent_export=concat`` never falls back (``rollout/agents/template.py``)."""
    turn_discount: float | None = None
    """Per-call rewards are discounted backwards: each call adds this factor times the next call's reward
    (AReaL's ``turn_discount``), in (0, 1]. Also the multi-turn workflow's discount. null: 1 (no discount),
    except ``MultiTurnWorkflow``'s own default 0.9."""
    agent_batching: str = "episodes"
    """When the episodes' requests are sampled: ``episodes`` (default) waits until every episode in flight
    has sent its next request (or ended), then samples them together, so which requests share a
    generation call, and so a seeded run, does not depend on timing (tools, processes, HTTP); ``eager``
    samples whatever is queued whenever the engine is free: faster when the episodes' tools take very
    different times, but not reproducible."""
    agent_batch_wait: float | None = 30.0
    """With ``agent_batching=episodes``: the most seconds a generation call waits without a new request or an
    episode's end before it samples the requests queued so far (counted in ``agent/batch_wait_timeouts``,
    warned once: such calls depend on timing). Ends a standstill, e.g. an HTTP client that allows fewer
    connections than the agent has episodes in flight. null: wait as long as it takes."""
    agent_max_calls: int = 64
    """The most chat calls one episode may make; a call beyond it is refused (HTTP 429, also in process) and
    counted in ``agent/bad_requests``, so a looping agent cannot grow an episode without bound."""
    agent_max_choices: int = 16
    """The largest ``n`` (choices) of one chat request; a larger one is refused (HTTP 400), and counted."""
    tool_call_parser: str = "hermes"
    """How tool calls are read out of the model's text: ``hermes`` (Qwen, ``<tool_call>{json}</tool_call>``),
    ``mistral``, ``llama3_json``, or the import path of a parser class."""

    def check(self, key: str) -> list[str]:
        p = one_of(f"{key}.offpolicy_mode", self.offpolicy_mode, ("concurrent", "lagged"))
        p += one_of(f"{key}.dtype", self.dtype, (None, *DTYPE_NAMES))
        p += at_least_one(f"{key}.max_sampling_rounds", self.max_sampling_rounds)
        p += integer_at_least(f"{key}.max_head_offpolicyness", self.max_head_offpolicyness, 0,
                              note="0 = synchronous; AReaL's GSM8K examples use 2")
        for name in ("consumer_batch_size", "max_concurrent_rollouts", "queue_size"):
            p += at_least_one(f"{key}.{name}", getattr(self, name), nullable=True)
        p += fraction(f"{key}.lagged_switch_prob", self.lagged_switch_prob)
        p += number_in(f"{key}.request_timeout", self.request_timeout, 0, open_low=True, unit="seconds")
        p += number_in(f"{key}.setup_timeout", self.setup_timeout, 0, open_low=True, unit="seconds")
        p += integer_at_least(f"{key}.request_retries", self.request_retries, 0)
        return p + self._check_agent(key)

    def _check_agent(self, key: str) -> list[str]:
        p = one_of(f"{key}.agent_export", self.agent_export, AGENT_EXPORTS)
        p += one_of(f"{key}.chat_template_type", self.chat_template_type, ("hf", "concat"))
        p += one_of(f"{key}.agent_batching", self.agent_batching, AGENT_BATCHING)
        p += number_in(f"{key}.agent_batch_wait", self.agent_batch_wait, 0, open_low=True, unit="seconds",
                       nullable=True, note="null: no limit")
        p += integer_at_least(f"{key}.agent_max_calls", self.agent_max_calls, 1)
        p += integer_at_least(f"{key}.agent_max_choices", self.agent_max_choices, 1)
        p += number_in(f"{key}.agent_timeout", self.agent_timeout, 0, open_low=True, unit="seconds", nullable=True,
                       note="null: no limit")
        p += number_in(f"{key}.turn_discount", self.turn_discount, 0, 1, open_low=True, nullable=True,
                       note="1: no discount; null: the workflow's own default")
        if self.agent is not None and self.workflow != DEFAULT_WORKFLOW:
            p.append(f"{key}.agent={self.agent!r} and {key}.workflow={self.workflow!r} both say how episodes run; "
                     f"set only one (drop {key}.workflow to run the agent, or {key}.agent=null to run the workflow).")
        if self.agent is None and self.agent_kwargs:
            p.append(f"{key}.agent_kwargs is set but {key}.agent is null; name the agent, or drop the kwargs.")
        p += integer_at_least(f"{key}.agent_processes", self.agent_processes, 0,
                              note="0: the agent runs in the trainer's process")
        if self.agent is None and self.agent_processes:
            p.append(f"{key}.agent_processes={self.agent_processes} is set but {key}.agent is null; it runs an "
                     f"HTTP-form agent in processes of its own: name the agent, or set {key}.agent_processes=0.")
        return p
