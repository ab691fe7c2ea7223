"""A Gymnasium text game and an OpenEnv environment, both "guess the number": the secret is drawn from the
reset seed, each guess is answered ``more`` or ``fewer``, a right guess ends the episode with reward 1.

``GuessNumber-v0`` is registered when this module is imported (``environment.id=tests.environments.games:
GuessNumber-v0``); :class:`GuessNumber` is the class (``environment.id=tests.environments.games.GuessNumber``).
``fail_reset`` (every seed) / ``fail_seed`` (one seed) / ``fail_step`` / ``nan_reward`` make the environment
misbehave on purpose."""

import math
import re
import string

import gymnasium as gym
from gymnasium import spaces
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

TEXT = spaces.Text(max_length=400, charset=string.printable)


def _guess(text: str) -> int | None:
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


def _reply(guess: int | None, secret: int) -> tuple[str, float, bool]:
    if guess is None:
        return "How many cards?", 0.0, False
    if guess == secret:
        return "There are no more.", 1.0, True
    return ("There are more." if guess < secret else "There are fewer."), 0.0, False


class GuessNumber(gym.Env):
    """Guess a number in 1..high; text observations and actions."""

    def __init__(self, high: int = 8, fail_reset: bool = False, fail_step: bool = False, nan_reward: bool = False,
                 fail_seed: int = -1):
        self.high, self.fail_reset, self.fail_step, self.nan_reward = high, fail_reset, fail_step, nan_reward
        self.fail_seed = fail_seed
        self.observation_space, self.action_space = TEXT, TEXT

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.fail_reset or seed == self.fail_seed:
            raise RuntimeError("the game could not start")
        self.secret = int(self.np_random.integers(1, self.high + 1))
        return f"There are 1 to {self.high} cards. How many cards?", {}

    def step(self, action):
        if self.fail_step:
            raise RuntimeError("the game crashed")
        text, reward, done = _reply(_guess(action), self.secret)
        return text, math.nan if self.nan_reward else reward, done, False, {}


class DigitGame(gym.Env):
    """Guess a number with a Discrete action space: the answer's last integer is the action."""

    def __init__(self):
        self.observation_space, self.action_space = TEXT, spaces.Discrete(4, start=1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(1, 5))
        return "How many cards?", {}

    def step(self, action):
        text, reward, done = _reply(int(action), self.secret)
        return text, reward, done, False, {}


gym.register("GuessNumber-v0", entry_point=GuessNumber)


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    text: str = ""


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    """The same game as an OpenEnv environment (each instance its own game: sessions may run side by side)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, high: int = 8, fail_step: bool = False):
        super().__init__()
        self.high, self.fail_step = high, fail_step
        self._state = State()

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self.secret = 1 + (seed or 0) % self.high
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text=f"There are 1 to {self.high} cards. How many cards?")

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        if self.fail_step:
            raise RuntimeError("the game crashed")
        self._state.step_count += 1
        text, reward, done = _reply(_guess(action.message), self.secret)
        return GuessObservation(text=text, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state
