"""Sampling settings: ``gconfig`` (the training rollouts) and ``eval_gconfig`` (the held-out evaluation)."""

from dataclasses import dataclass, field

from .base import Checked, at_least_one, integer_at_least, number_in


@dataclass
class GenerationHyperparameters(Checked):
    """Sampling settings of the rollout (``gconfig``) and of evaluation (``eval_gconfig``)."""

    n_samples: int = 1
    """Answers sampled per prompt: the group size G."""
    max_new_tokens: int = 16384
    """Most tokens generated per answer."""
    min_new_tokens: int = 0
    """End-of-answer tokens are suppressed until an answer has this many tokens."""
    max_tokens: int = 32768
    """Prompt + answer length limit (or the model's positions, if fewer): each answer has at most
    ``min(max_new_tokens, limit - prompt tokens)`` tokens; prompts with no room are dropped when the data is
    built (``train_dataset.overlong_prompts``)."""
    greedy: bool = False
    """Greedy decoding (argmax); temperature, top_p and top_k are then not used."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest token set with this much probability (1 = off)."""
    top_k: int = 100000000
    """Sample from the k most likely tokens (0, or at least the vocabulary size, = off)."""
    temperature: float = 1.0
    """Sampling temperature (the logits are divided by it)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra token ids that end an answer (EOS and pad always do)."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: an answer ends with the token that completes one of them in its text (decoded
    without special tokens); that token is kept and no token after it is kept or trained on. Only text
    after the answer's first ``min_new_tokens`` tokens counts. The answer is then not truncated, as with
    a stop token."""

    def check(self, key: str) -> list[str]:
        p = [x for name in ("n_samples", "max_new_tokens", "max_tokens")
             for x in at_least_one(f"{key}.{name}", getattr(self, name))]
        p += number_in(f"{key}.min_new_tokens", self.min_new_tokens, 0, self.max_new_tokens,
                       high_label=f"max_new_tokens={self.max_new_tokens}")
        p += number_in(f"{key}.top_p", self.top_p, 0, 1, open_low=True)
        p += integer_at_least(f"{key}.top_k", self.top_k, 0, note="0: off")
        if not self.greedy:
            p += number_in(f"{key}.temperature", self.temperature, 0, open_low=True, note=f"or set {key}.greedy=true")
        if isinstance(self.stop, str):
            p.append(f"{key}.stop: got {self.stop!r}; must be a list of strings (write {key}.stop=[{self.stop!r}]).")
        elif bad := [s for s in (self.stop or []) if not isinstance(s, str) or not s]:
            p.append(f"{key}.stop: got {list(self.stop)!r}; every stop string must be a non-empty string "
                     f"(remove {', '.join(repr(s) for s in bad)}, or set {key}.stop=[] for none).")
        return p

