"""Stop strings (``gconfig.stop``): text that ends an answer, for both rollout engines.

The rule. An answer's text is its tokens decoded as the workflows decode them for the rewards
(``skip_special_tokens=True``). The answer ends with the token during which a stop string first
appears in that text: the token is kept (it produced the stop string, and its logprob is that of a
sampled token like any other) and every token after it is cut, so nothing past the stop string is
sampled on or trained on. Only text after the answer's first ``min_tokens`` tokens counts (a stop
string must end there; it may start earlier), as end-of-answer tokens are suppressed until then.

Formally, with ``text(k)`` the decoded text of the first ``k`` tokens and ``base = len(text(min_tokens))``,
the answer keeps the smallest ``k > min_tokens`` such that some stop string ``s`` occurs in ``text(k)``
at or after index ``base - len(s) + 1``; none such ``k``: the answer has no stop string.

Two functions serve the engines:

* :func:`stop_at` gives that ``k`` exactly. It decodes the whole answer once and, only when a stop
  string is there, binary-searches the prefixes: ``O(n log n)`` decoding instead of the ``O(n^2)`` of
  decoding every prefix. The search needs one property of the tokenizer's decoding: once a prefix's
  text holds a stop string, every longer prefix's text holds it too (appending tokens appends text).
  Decoders that merge or drop characters across token boundaries (the replacement character of an
  incomplete UTF-8 sequence, whitespace clean-up) could break it only for stop strings made of such
  characters.
* :func:`may_have_stopped` is the cheap test an engine runs after every new token: it decodes a short
  window of tail tokens per answer, in one batched call. It may say yes for an answer without a
  stop string (the engine then asks :func:`stop_at`) and, for unusual tokenizers, no for one with
  a stop string; the engines run :func:`stop_at` on every answer when its generation call ends,
  so a miss only lets an answer run on, and every answer is still cut exactly by the rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import StoppingCriteria

__all__ = ["may_have_stopped", "stop_at", "stop_strings", "text_of"]


def stop_strings(gconfig: Any) -> tuple[str, ...]:
    """``gconfig.stop`` as a tuple; empty when ``gconfig`` has no such attribute (any object with the
    sampling attributes may serve as a gconfig)."""
    stop = getattr(gconfig, "stop", None)
    if not stop:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)


def text_of(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of an answer's tokens, as the workflows decode it for the rewards."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def _found(text: str, stops: Sequence[str], base: int) -> bool:
    """Whether a stop string occurs in ``text`` ending after index ``base`` (its first ``base`` characters
    are the text of the tokens that do not count)."""
    return any(text.find(s, max(0, base - len(s) + 1)) != -1 for s in stops)


def stop_at(tokenizer: Any, ids: Sequence[int], stops: Sequence[str], *, min_tokens: int = 0,
            checked: int = 0) -> int | None:
    """How many of the answer's tokens ``ids`` to keep: the fewest whose text holds a stop string (the
    rule in the module docstring), or None when it holds none. ``checked``: a number of first tokens
    known to hold none (an earlier call said so), which narrows the search."""
    n = len(ids)
    lo = max(int(checked), int(min_tokens), 0)  # text(lo) holds no stop string that counts
    if not stops or n <= lo:
        return None
    base = len(text_of(tokenizer, ids[:min_tokens])) if min_tokens > 0 else 0
    if not _found(text_of(tokenizer, ids), stops, base):
        return None
    hi = n  # text(hi) holds one; text(lo) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _found(text_of(tokenizer, ids[:mid]), stops, base):
            hi = mid
        else:
            lo = mid
    return hi


def may_have_stopped(tokenizer: Any, answers: Sequence[Sequence[int]], new_from: Sequence[int],
                     stops: Sequence[str]) -> list[bool]:
    """For each answer, whether its tokens from ``new_from[i]`` on may have completed a stop string (a
    filter before :func:`stop_at`; see the module docstring). One batched decode of short windows.

    Why the window suffices: a stop string completed by the new tokens ends in their text and starts at
    most ``len(s) - 1`` characters before it. When each token before them decodes to at least one
    character, ``longest`` such tokens hold those characters, and one more absorbs what a window loses
    at its start (decoded alone, its first token may lack the space that joins it to the token before).
    Tokens that decode to nothing (special tokens, pieces of one character) widen the window: it
    doubles while its text is shorter than the characters it must hold, up to the whole answer."""
    if not stops or not answers:
        return [False] * len(answers)
    longest = max(len(s) for s in stops)
    context = [longest + 1] * len(answers)
    result = [False] * len(answers)
    todo = [i for i in range(len(answers)) if len(answers[i]) > new_from[i]]
    while todo:
        starts = [max(0, new_from[i] - context[i]) for i in todo]
        texts = tokenizer.batch_decode([list(answers[i][s:]) for i, s in zip(todo, starts)],
                                       skip_special_tokens=True)
        wider = []
        for i, s, text in zip(todo, starts, texts):
            if any(x in text for x in stops):
                result[i] = True
            elif s > 0 and len(text) < longest + 1 + len(answers[i]) - new_from[i]:
                context[i] *= 2
                wider.append(i)
        todo = wider
    return result


class StopStrings(StoppingCriteria):
    """Ends each row once its answer holds one of ``gconfig.stop`` (``stops.py``). A row's answer is its
    tokens of earlier segments (``before``) plus this call's new tokens, so a stop string may straddle two
    segments of a partial rollout. Rows already ended by a stop token, or past their cap (their tokens
    are cut anyway), are not checked again."""

    def __init__(self, tokenizer, stops: tuple[str, ...], before: list[list[int]], caps: list[int],
                 prompt_width: int, stop_ids: set[int], min_tokens: int):
        self.tokenizer, self.stops, self.stop_ids, self.min_tokens = tokenizer, stops, stop_ids, min_tokens
        self.answers = [list(b) for b in before]
        self.segment_start = [len(b) for b in before]
        self.caps, self.seen = caps, prompt_width
        self.active = [len(b) < c for b, c in zip(before, caps)]
        self.stopped = [False] * len(before)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        new = input_ids[:, self.seen:].tolist()
        self.seen = input_ids.shape[1]
        rows, new_from = [], []
        for r, toks in enumerate(new):
            if not self.active[r]:
                continue
            new_from.append(len(self.answers[r]))
            self.answers[r] += toks
            rows.append(r)
            if any(t in self.stop_ids for t in toks) or len(self.answers[r]) >= self.caps[r]:
                self.active[r] = False  # ended by a stop token (then padded), or cut at its cap: checked after the call
        maybe = may_have_stopped(self.tokenizer, [self.answers[r] for r in rows], new_from, self.stops)
        for r, m in zip(rows, maybe):
            if m and stop_at(self.tokenizer, self.answers[r], self.stops, min_tokens=self.min_tokens,
                             checked=self.segment_start[r]) is not None:
                self.stopped[r], self.active[r] = True, False
        return torch.tensor(self.stopped, dtype=torch.bool, device=input_ids.device)
