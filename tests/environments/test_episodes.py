"""Each environment type's rollouts on a real engine (the built-in model) or a scripted one: every token a row
trains is one the engine sampled, with its log-prob and version; the reward is the environment's own scoring
(hand-derived here), its parts are ``env/<name>``; tools run in process; the turn limit, invalid actions and
the environment's failures are counted, and only a rollout whose every episode failed stops the run."""

import re
import types

import pytest
import torch

from areal_trainer.config.data import DatasetConfig
from areal_trainer.config.schema import GenerationHyperparameters
from areal_trainer.data.datasets import build_samples
from areal_trainer.environments import Settings, load
from areal_trainer.environments.reward import EnvironmentReward
from areal_trainer.environments.workflow import EnvironmentWorkflow
from areal_trainer.errors import UserError
from areal_trainer.model.builtin import build_model, build_tokenizer
from areal_trainer.reward.service import RewardService
from areal_trainer.rollout.engines.hf import HFEngine
from areal_trainer.rollout.workflows.single_turn import RLVRWorkflow
from tests.environments.scripted import RuleEngine
from tests.rollout.test_agent import Recording, _rows_match_engine

CPU = torch.device("cpu")
REWARD = types.SimpleNamespace(error_value=-1.0, max_error_fraction=0.5)
GAME = "tests.environments.games:GuessNumber-v0"


def samples(env, tok, split="train", n=4):
    return build_samples(DatasetConfig(), tok, "train_dataset", rows=env.rows(split)[:n])


def stat(groups, key):
    return sum(float(g.stats[key].value) for g in groups if key in g.stats)


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer("builtin:tiny")
    return tok, build_model("builtin:tiny", tok, seed=0)


def agent_workflow(env, engine, tok, **kw):
    return EnvironmentWorkflow(environment=env, engine=engine, tokenizer=tok, reward=REWARD, **kw)


@pytest.mark.parametrize("settings", [
    Settings(type="reasoning_gym", id="chain_sum", kwargs={"min_digits": 1, "max_digits": 1}, size=8),
    Settings(type="verifiers", id="tests.environments.arith_tasks", size=8),
])
def test_single_turn_rows_are_the_engines_samples_scored_by_the_environment(tiny, settings):
    tok, model = tiny
    env = load(settings)
    engine = Recording(HFEngine(model, tok, device=CPU))
    with RewardService([EnvironmentReward(env)]) as reward:
        torch.manual_seed(0)
        groups = RLVRWorkflow(engine=engine, tokenizer=tok, reward=reward).rollout(
            samples(env, tok), GenerationHyperparameters(n_samples=2, max_new_tokens=6))
    assert _rows_match_engine(groups, engine.returned) == len(engine.returned) == 8
    assert all("reward/environment" in g.stats and "environment" in g.source_values for g in groups)


def test_reasoning_gym_scores_the_tagged_answer_with_its_own_score_answer():
    env = load(Settings(type="reasoning_gym", id="chain_sum", size=3))
    row = env.rows("train")[0].columns
    answer = row["answer"]
    score = lambda text: env_score(env, row, text)  # noqa: E731
    assert score(f"so <answer>{answer}</answer>") == 1.0
    assert score(f"<answer>= {answer}</answer>") == pytest.approx(len(answer) / (len(answer) + 2))  # partial credit
    assert score(answer) == 0.0  # no tag: nothing to score
    untagged = load(Settings(type="reasoning_gym", id="chain_sum", size=3, answer_tag=None))
    assert env_score(untagged, untagged.rows("train")[0].columns, f" {answer}\n") == 1.0
    assert untagged.rows("train")[0].columns["prompt"][0]["role"] == "user"  # no tag: no instruction about one
    number = load(Settings(type="reasoning_gym", id="chain_sum", size=3, answer_pattern=r"-?\d+"))
    assert env_score(number, number.rows("train")[0].columns, f"1 + 2 is 7, no: {answer}.") == 1.0
    assert env_score(number, number.rows("train")[0].columns, "no number") == 0.0


def env_score(env, row, text):
    import asyncio

    return asyncio.run(env.score(row, text)).reward


def test_a_verifiers_task_scores_with_its_reward_functions_weights_and_metrics():
    env = load(Settings(type="verifiers", id="tests.environments.arith_tasks", size=2))
    row = env.rows("train")[0].columns
    import asyncio

    right = asyncio.run(env.score(row, row["answer"]))
    assert right.reward == 1.0 * 1 + 0.5 * 1 and right.parts == {"correct": 1.0, "short": 1.0, "words": 1.0}
    wrong = asyncio.run(env.score(row, "it is 5 or so"))
    assert wrong.reward == 0.0 and wrong.parts == {"correct": 0.0, "short": 0.0, "words": 5.0}
    assert row["prompt"][0] == {"role": "system", "content": "Answer with the number."}
    own = load(Settings(type="verifiers", id="tests.environments.arith_tasks", size=2, system_prompt="Be brief."))
    assert own.rows("train")[0].columns["prompt"][0]["content"] == "Be brief."


def calculator(text: str) -> str:
    """The model's part in the tool episodes: a calc call for the question's sum, then the tool's result."""
    if "<tool_response>" in text:
        result = re.findall(r"<tool_response>\s*(-?\d+)", text)[-1]
        return f"#### {result}"
    a, b = re.findall(r"(\d+)", text.split("<|im_start|>user")[-1])[:2]
    op = "-" if re.search(r"gives|lost|took|fewer|left", text.split("<|im_start|>user")[-1]) else "+"
    return f'<tool_call>\n{{"name": "calc", "arguments": {{"expression": "{a} {op} {b}"}}}}\n</tool_call>'


@pytest.mark.parametrize("export", ["individual", "concat"])
def test_a_verifiers_tool_task_runs_its_mcp_tool_in_process_and_trains_the_sampled_calls(export):
    tok = build_tokenizer("builtin:tiny-tools")
    env = load(Settings(type="verifiers", id="examples.environments.calc_taskset", size=6, max_turns=3))
    engine = RuleEngine(tok, calculator)
    wf = agent_workflow(env, engine, tok, export=export)
    try:
        groups = wf.rollout(samples(env, tok, n=3), GenerationHyperparameters(n_samples=2, max_new_tokens=64))
    finally:
        wf.close()
    assert _rows_match_engine(groups, engine.returned) == len(engine.returned) == 12  # 6 episodes x 2 calls
    assert stat(groups, "agent/tool_calls") == 6 and stat(groups, "agent/tool_errors") == 0
    assert stat(groups, "env/episodes") == 6 and stat(groups, "env/errors") == 0
    # the tool's result reached the model, and the task scored its final answer: right for every problem
    # whose sum the rule wrote correctly; the taskset's metric counts the tool's results in the trace
    assert all(g.stats["env/tool_calls"].value == 1.0 for g in groups)
    assert [g.episode_rewards for g in groups] == [(g.stats["env/correct"].value,) * 2 for g in groups]
    assert sum(g.stats["env/correct"].value for g in groups) >= 2


def test_a_tool_that_raises_gives_the_model_its_error_and_the_episode_goes_on(capsys):
    tok = build_tokenizer("builtin:tiny-tools")
    env = load(Settings(type="verifiers", id="examples.environments.calc_taskset", size=2, max_turns=2))
    bad = '<tool_call>\n{"name": "calc", "arguments": {"expression": "Tom + 3"}}\n</tool_call>'
    engine = RuleEngine(tok, lambda text: "#### 6" if "<tool_response>" in text else bad)
    wf = agent_workflow(env, engine, tok)
    try:
        groups = wf.rollout(samples(env, tok, n=1), GenerationHyperparameters(n_samples=1, max_new_tokens=64))
    finally:
        wf.close()
    assert stat(groups, "agent/tool_errors") == 1 and stat(groups, "env/errors") == 0
    assert len(engine.returned) == 2  # the episode went on after the error: the model answered once more
    response = tok.decode(engine.returned[1][0]).split("<tool_response>")[-1]
    assert not re.match(r"\s*-?\d+\s*</tool_response>", response)  # the error's text, not a number
    assert "not an expression of integers with + and -: 'Tom + 3'" in capsys.readouterr().err


def _guess_one_then_two(env, tok, *, n_samples: int):
    """One rollout of ``env``'s games answering 1, then 2, discounted by 0.5; its rows are the engine's tokens."""
    engine = RuleEngine(tok, lambda text: "1" if text.count("<|im_start|>assistant") == 1 else "2")
    wf = agent_workflow(env, engine, tok, turn_discount=0.5)
    try:
        groups = wf.rollout(samples(env, tok), GenerationHyperparameters(n_samples=n_samples, max_new_tokens=4))
    finally:
        wf.close()
    assert _rows_match_engine(groups, engine.returned) == len(engine.returned)
    return groups


@pytest.mark.parametrize("kind,ident", [("gym", GAME), ("openenv", "tests.environments.games.GuessEnvironment")])
def test_a_game_steps_on_the_models_answers_with_step_rewards_discounted(kind, ident):
    tok = build_tokenizer("builtin:tiny")
    env = load(Settings(type=kind, id=ident, kwargs={"high": 2}, size=4, max_turns=3))
    groups = _guess_one_then_two(env, tok, n_samples=1)
    for g in groups:  # the secret is 1 or 2: guessed right at once (1), or after one wrong guess (0 + 0.5 * 1)
        assert g.episode_rewards in ((1.0,), (0.5,)), g.episode_rewards
        assert g.stats["env/return"].value == 1.0 and g.stats["env/turn_limits"].value == 0
    assert {g.episode_rewards for g in groups} == {(1.0,), (0.5,)}


def test_the_turn_limit_and_invalid_actions_end_episodes_and_are_counted():
    tok = build_tokenizer("builtin:tiny")
    env = load(Settings(type="gym", id=GAME, kwargs={"high": 8}, size=4, max_turns=2))
    wf = agent_workflow(env, RuleEngine(tok, lambda text: "9"), tok)  # never right: 9 is above every secret
    try:
        groups = wf.rollout(samples(env, tok), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    finally:
        wf.close()
    assert stat(groups, "env/turn_limits") == 4 and stat(groups, "agent/calls") == 8
    digits = load(Settings(type="gym", id="tests.environments.games.DigitGame", size=4))
    assert digits.discrete == (1, 5)
    wf = agent_workflow(digits, RuleEngine(tok, lambda text: "Tom has apples"), tok)  # no number: no action
    try:
        groups = wf.rollout(samples(digits, tok), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    finally:
        wf.close()
    assert stat(groups, "env/invalid_actions") == 4 and all(g.episode_rewards == (0.0,) for g in groups)


@pytest.mark.parametrize("kwargs,counter", [({"fail_seed": 1}, "env/errors"),
                                            ({"nan_reward": True}, "env/bad_rewards")])
def test_an_environment_that_fails_is_counted_and_the_run_goes_on_unless_every_episode_fails(kwargs, counter, capsys):
    tok = build_tokenizer("builtin:tiny")
    env = load(Settings(type="gym", id=GAME, kwargs={"high": 8, **kwargs}, size=4, max_turns=2))
    wf = agent_workflow(env, RuleEngine(tok, lambda text: "3"), tok)
    try:
        if "fail_seed" in kwargs:  # one seed of four fails: counted, named once, scored error_value
            groups = wf.rollout(samples(env, tok), GenerationHyperparameters(n_samples=2, max_new_tokens=4))
            assert stat(groups, counter) == 2 and stat(groups, "env/episodes") == 8
            assert stat(groups, "agent/errors") == 0
            assert "reset(seed=1) raised RuntimeError: the game could not start" in capsys.readouterr().err
        else:  # every episode's reward is NaN: the run stops, naming the environment and the failure
            with pytest.raises(UserError, match=r"every one of the 4 episodes .* returned nan"):
                wf.rollout(samples(env, tok), GenerationHyperparameters(n_samples=1, max_new_tokens=4))
    finally:
        wf.close()


def test_a_failing_scoring_of_single_turn_rows_is_counted_and_only_a_batch_that_all_fails_stops_the_run():
    tok = build_tokenizer("builtin:tiny")
    env = load(Settings(type="verifiers", id="tests.environments.arith_tasks", size=4,
                        kwargs={"fail_on": 0, "nan_on": 1}))
    rows = samples(env, tok)
    with RewardService([EnvironmentReward(env)], max_error_fraction=0.0) as reward:
        scores = reward.score_completions(rows, ["30", "30", "30", "30"])
        assert scores.errors == [1, 0, 0, 0] and scores.nonfinite == [0, 1, 0, 0]
        assert scores.rewards[:2] == [0.0, 0.0] and scores.stats()["env/short"] == 1.0
        with pytest.raises(UserError, match=r"1 of 1 samples of one batch failed \(every one of them\)"):
            reward.score_completions(rows[:1], ["30"])


@pytest.fixture
def openenv_server():
    """The OpenEnv game served over HTTP on this machine (OpenEnv's own server app), its URL."""
    import socket
    import threading
    import time

    import uvicorn
    from openenv.core.env_server.http_server import create_app

    from tests.environments.games import GuessAction, GuessEnvironment, GuessObservation

    app = create_app(lambda: GuessEnvironment(high=2), GuessAction, GuessObservation, max_concurrent_envs=8)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(30)


def test_an_openenv_server_by_url_plays_like_its_class(openenv_server):
    tok = build_tokenizer("builtin:tiny")
    env = load(Settings(type="openenv", id=openenv_server, size=4, max_turns=3))
    assert env.text_field == "message"  # read from the server's /schema
    groups = _guess_one_then_two(env, tok, n_samples=2)
    # seeds 0..3: the secret is 1 + seed % 2, so even seeds are guessed at once, odd ones at the second guess
    assert [g.episode_rewards for g in groups] == [(1.0, 1.0), (0.5, 0.5), (1.0, 1.0), (0.5, 0.5)]
    assert env.rows("train")[0].columns["prompt"][-1]["content"] == "Episode 0."  # episodes start when they run
