"""Rewards from a scoring service over HTTP (a reward model server, a code sandbox, a judge).

Protocol: for each batch of at most ``batch_size`` samples, ``POST <url>`` with
``Content-Type: application/json`` and the body::

    {"samples": [{"prompt": ..., "completion": ..., "answer": ..., "fields": {...}}, ...]}

(``prompt``/``completion`` are strings, or lists of ``{"role", "content"}`` messages for chat rows;
``fields`` holds the row's other columns; values JSON cannot hold are sent as their ``str``.) The
service answers ``200`` with::

    {"rewards": [0.5, null, ...]}

one reward per sample, in order: a number, or ``null`` for "not applicable".

Each request has ``timeout`` seconds; a failed one is tried again up to ``retries`` times, waiting
``backoff``, ``2*backoff``, ``4*backoff``... seconds in between, with at most ``max_concurrent``
requests in flight. A client error (4xx other than 408 and 429) is not retried: the same request
would fail the same way. When a batch still fails (connection refused, HTTP error, a body that is
not the JSON above, a wrong number of rewards), the run stops with
:class:`~areal_trainer.errors.UserError` naming the URL and the last response: a reward service that
does not answer must never turn into silent zero rewards.

Requests use ``urllib`` (standard library) in a thread pool of ``max_concurrent`` threads, so that
no extra dependency is needed and the event loop is never blocked. ``http(s)_proxy``/``no_proxy``
from the environment apply as for any ``urllib`` client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import numbers
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from ..errors import UserError
from .functions import RewardSample

BODY_EXCERPT = 200
"""Characters of a bad response body shown in the error message."""


def url_problems(url: Any, key: str) -> list[str]:
    """Problems with ``url`` as the address of a scoring service (an empty list when it is fine)."""
    example = "e.g. 'http://localhost:8000/score'"
    if not isinstance(url, str) or not url.strip():
        return [f"{key}: got {url!r}; give the scoring service's URL, {example}."]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return [f"{key}: {url!r} must start with http:// or https://, {example}."]
    if not parts.hostname:
        return [f"{key}: {url!r} names no host; write it as http://HOST:PORT/PATH, {example}."]
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        return [f"{key}: {url!r} has an invalid port; write it as http://HOST:PORT/PATH, {example}."]
    if any(c.isspace() for c in url):
        return [f"{key}: {url!r} contains whitespace; remove it."]
    return []


class _Failure(Exception):
    def __init__(self, what: str, retry: bool = True):
        super().__init__(what)
        self.what, self.retry = what, retry


class RemoteReward:
    """A reward source that asks a scoring service over HTTP (see the module docs for the protocol)."""

    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5,
                 max_concurrent: int = 4, batch_size: int = 64, name: str = "remote"):
        problems = url_problems(url, "url")
        if problems:
            raise ValueError(problems[0])
        if not timeout > 0 or retries < 0 or backoff < 0 or max_concurrent < 1 or batch_size < 1:
            raise ValueError(f"RemoteReward needs timeout > 0, retries >= 0, backoff >= 0, max_concurrent >= 1 "
                             f"and batch_size >= 1; got {timeout}, {retries}, {backoff}, {max_concurrent}, "
                             f"{batch_size}")
        self.url, self.timeout, self.retries, self.backoff = url, float(timeout), int(retries), float(backoff)
        self.max_concurrent, self.batch_size, self.name, self.label = max_concurrent, batch_size, name, url
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    async def score(self, samples: list[RewardSample]) -> list[float | None]:
        """One reward (a float, or None) per sample, in order; raises :class:`UserError` when the
        service fails a batch after the retries."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(self.max_concurrent,
                                                                   thread_name_prefix="areal-remote")
        # The semaphore belongs to this call's event loop (each synchronous score() may run a new one).
        slots = asyncio.Semaphore(self.max_concurrent)
        batches = [samples[i:i + self.batch_size] for i in range(0, len(samples), self.batch_size)]
        tasks = [asyncio.ensure_future(self._score_batch(b, slots)) for b in batches]
        try:
            parts = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise
        return [r for part in parts for r in part]

    async def _score_batch(self, batch: list[RewardSample], slots: asyncio.Semaphore) -> list[float | None]:
        body = json.dumps({"samples": [_sample_json(s) for s in batch]}, default=_jsonable).encode()
        loop = asyncio.get_running_loop()
        attempts = 0
        while True:
            attempts += 1
            async with slots:
                try:
                    return await loop.run_in_executor(self._executor, self._post, body, len(batch))
                except _Failure as f:
                    failure = f
            if not failure.retry or attempts > self.retries:
                break
            await asyncio.sleep(self.backoff * 2 ** (attempts - 1))
        tried = f"after {attempts} attempt{'s' if attempts != 1 else ''}" if failure.retry else "(not retried)"
        raise UserError(f"reward service {self.name} at {self.url} failed a batch of {len(batch)} samples {tried}: "
                        f"{failure.what}. Check that the service runs and answers {{\"rewards\": [...]}} with one "
                        "number or null per sample (areal_trainer/reward/remote.py documents the protocol).")

    def _post(self, body: bytes, n: int) -> list[float | None]:
        """One request; raises :class:`_Failure` describing the response when it is not usable."""
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            retry = e.code >= 500 or e.code in (408, 429)
            raise _Failure(f"HTTP {e.code}, body {_text(e.read())!r}", retry) from None
        except urllib.error.URLError as e:
            raise _Failure(f"no response ({e.reason})") from None
        except (OSError, http.client.HTTPException) as e:  # timeouts, resets, broken responses
            raise _Failure(f"no usable response ({type(e).__name__}: {e})") from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise _Failure(f"HTTP {status}, body is not JSON: {_text(raw)!r}") from None
        rewards = data.get("rewards") if isinstance(data, dict) else None
        if not isinstance(rewards, list):
            raise _Failure(f"HTTP {status}, body has no \"rewards\" list: {_text(raw)!r}")
        if len(rewards) != n:
            raise _Failure(f"HTTP {status}, {len(rewards)} rewards for {n} samples: {_text(raw)!r}")
        if not all(r is None or isinstance(r, numbers.Real) for r in rewards):
            raise _Failure(f"HTTP {status}, rewards must be numbers or null: {_text(raw)!r}")
        return [None if r is None else float(r) for r in rewards]

    def close(self) -> None:
        """Stop the request threads (idempotent)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _sample_json(s: RewardSample) -> dict:
    return {"prompt": s.prompt, "completion": s.completion, "answer": s.answer, "fields": dict(s.fields)}


def _jsonable(value: Any) -> Any:
    """numpy arrays and scalars as lists/numbers; anything else JSON cannot hold as its ``str``."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else str(value)


def _text(raw: bytes) -> str:
    return raw[:BODY_EXCERPT * 4].decode("utf-8", "replace")[:BODY_EXCERPT]
