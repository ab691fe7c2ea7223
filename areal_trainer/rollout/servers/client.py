"""The trainer's side of the inference servers: :class:`ServerEngine`, a rollout engine
(``rollout/types.py::InferenceEngine``) whose tokens are sampled by server processes over HTTP.

Workflows, agents and the rollout sources use it as any engine: ``generate(prompts, gconfig)`` returns one
:class:`Generation` per prompt, in order, with per-token log-probs and versions; ``update_weights(model, version)``
pushes the trainer's weights to every server (``weights.py``).

Spreading. A call's prompts are cut into contiguous pieces, one per server at most, keeping a prompt's repeated
samples together (so a server prefills a prompt once for its samples); each piece goes to the server with the fewest
requests in flight. Every piece carries a seed made from ``seed``, the weights' version and the piece's place in
the calls since that version, and the server seeds its sampler with it: a piece's tokens depend on the seed, the
weights and its prompts only, not on which server sampled it or on timing. Synchronous and lagged runs are
therefore reproducible on servers (and a resumed run continues as the uninterrupted one does).

Faults. A piece whose request fails (refused, reset, ``rollout.request_timeout`` passed, a 5xx) is sent again to
another live server, up to ``rollout.request_retries`` times; the failed server is marked down and, when the trainer
started it, restarted in the background and brought to the current weights before it serves again. A request the
server refuses (4xx) is a bug of the request: it stops the run with the server's message. Counts are in
:meth:`ServerEngine.telemetry` (``rollout/server_*``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from ...errors import UserError
from ..types import Generation
from .protocol import gconfig_to_json, generation_from_json
from .weights import Unreachable


class ServerDown(Exception):
    """A server did not answer usably (refused, reset, timed out, a 5xx)."""


class NoServerLeft(UserError):
    """Every server is down."""


def split_runs(prompts: Sequence[Sequence[int]], parts: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges cutting ``prompts`` into at most ``parts`` contiguous pieces of about equal rows, never
    inside a run of identical consecutive prompts (a prompt's samples)."""
    starts = [i for i in range(len(prompts)) if i == 0 or prompts[i] != prompts[i - 1]] + [len(prompts)]
    runs = len(starts) - 1
    parts = max(1, min(parts, runs))
    inner = starts[1:-1]  # the boundaries a cut may take: at least parts - 1 of them
    out, lo = [], 0
    for k in range(1, parts):
        target = round(len(prompts) * k / parts)
        # The boundary nearest the target, past the previous cut, that leaves one for each later cut (a cut
        # taken far ahead, at the end of a long last run, would leave the later pieces none).
        usable = [s for j, s in enumerate(inner) if s > lo and len(inner) - 1 - j >= parts - 1 - k]
        hi = min(usable, key=lambda s: (abs(s - target), s))
        out.append((lo, hi))
        lo = hi
    return [*out, (lo, len(prompts))]


def piece_seed(seed: int, version: int, call: int, piece: int, rank: int = 0) -> int:
    """A 63-bit seed for one piece of one generate call of trainer process ``rank``."""
    x = ((seed * 1_000_003 + version) * 998_244_353 + call * 65_537 + piece) * 257 + rank
    x ^= x >> 29
    x = (x * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    return x >> 1


class ServerEngine:
    """A rollout engine backed by the servers at ``addresses`` (``host:port``); see the module docstring.

    Args:
        addresses: the servers.
        pusher: pushes weights to every live server (``weights.py``: disk or weight group).
        seed: the run's seed, mixed into every piece's seed.
        request_timeout: seconds one request may take.
        retries: how many times a failed piece is sent again (to another server).
        restart: ``restart(i)`` brings server ``i`` back and returns its new address (the trainer's own
            servers), or None.
        max_positions: the model's positions (``rollout/limits.py``), for the row limit.
        can_switch: whether the servers' engine can switch weights inside a generate call.
        barrier: waits for every trainer process (after each update: only the main process pushes, and no process
            samples with the old weights once an update returned).
        rank: this trainer process's rank, mixed into the seeds (processes sample different prompts).
    """

    takes_weight_stream = True
    """Weights are sent on in buckets: sharded ones may come gathered tensor by tensor (``fsdp.WeightStream``)."""

    def __init__(self, addresses: Sequence[str], *, pusher, seed: int, request_timeout: float, retries: int,
                 restart: Callable[[int], str | None] | None = None, max_positions: Any = None,
                 can_switch: bool = False, barrier: Callable[[], None] = lambda: None, rank: int = 0):
        self.addresses = list(addresses)
        self.pusher, self.seed, self.timeout, self.retries = pusher, int(seed), float(request_timeout), int(retries)
        self.restart, self.max_positions, self.can_switch = restart, max_positions, can_switch
        self.barrier, self.rank = barrier, int(rank)
        self._version = 0
        self._calls = itertools.count()
        self._lock = threading.Lock()
        self._in_flight = [0] * len(self.addresses)
        self._down: set[int] = set()
        self._restarted: set[int] = set()
        """Servers brought back that take the weights at the next update before they serve again."""
        self._stats = {"requests": 0, "retries": 0, "failures": 0, "restarts": 0}
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout, connect=10.0),
                                  limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))
        self._pool = ThreadPoolExecutor(max_workers=max(4, 2 * len(self.addresses)),
                                        thread_name_prefix="areal-server-client")
        self.interruptions = 0

    # -- the engine contract ----------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def generate(self, prompts: list[list[int]], gconfig) -> list[Generation]:
        if not prompts:
            return []
        body_g = gconfig_to_json(gconfig)
        with self._lock:
            call, version = next(self._calls), self._version
        pieces = split_runs(prompts, len(self.addresses) - len(self._down) or 1)
        futures = [self._pool.submit(self._piece, prompts[lo:hi], body_g,
                                     piece_seed(self.seed, version, call, k, self.rank))
                   for k, (lo, hi) in enumerate(pieces)]
        out: list[Generation] = []
        for f in futures:
            out.extend(f.result())
        return out

    def update_weights(self, model, version: int) -> None:
        """Push ``model``'s weights (a module, a state dict, or a stream of pairs) as policy ``version`` to every
        live server; raises :class:`UserError` naming the server when one cannot take them in time."""
        try:
            self._push(model, version)
        finally:
            settle = getattr(self.pusher, "settle", None)
            if settle is not None:
                settle(model)  # the weights' last pass is over (every retry done)
            self.barrier()

    def _push(self, model, version: int) -> None:
        with self._lock:
            rejoin = set(self._restarted)
            live = [i for i in range(len(self.addresses)) if i not in self._down or i in rejoin]
        while True:  # a server found gone is marked down (and restarted); the others take the weights
            if not live:
                raise NoServerLeft(self._none_left())
            try:
                gone = self.pusher.push(model, int(version), [self.addresses[i] for i in live]) or []
            except Unreachable as e:
                gone, retry = e.addresses, True
            else:
                retry = False
            lost = [i for i in live if self.addresses[i] in gone]
            for i in lost:
                with self._lock:
                    self._stats["failures"] += 1
                    self._restarted.discard(i)
                    rejoin.discard(i)
                self._mark_down(i)
            live = [i for i in live if i not in lost]
            if not retry:
                break
        with self._lock:
            self._version = int(version)
            self._calls = itertools.count()
            self._down -= rejoin  # restarted servers hold the current weights now
            self._restarted -= rejoin

    def schedule_update(self, after_tokens: int, model, version: int) -> None:
        live = [self.addresses[i] for i in range(len(self.addresses)) if i not in self._down]
        try:
            self.pusher.schedule(model, int(version), int(after_tokens), live)
        finally:
            self.barrier()

    def telemetry(self) -> dict[str, float]:
        """What happened since the last call, as metrics: ``rollout/server_requests``, ``_retries``, ``_failures``,
        ``_restarts``, ``rollout/servers_down`` (now) and ``perf/weight_update_s`` (the last update's seconds)."""
        with self._lock:
            out = {f"rollout/server_{k}": float(v) for k, v in self._stats.items()}
            self._stats = dict.fromkeys(self._stats, 0)
            out["rollout/servers_down"] = float(len(self._down))
        out["perf/weight_update_s"] = float(getattr(self.pusher, "last_seconds", 0.0))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    # -- requests --------------------------------------------------------------------------------------
    def _pick(self, avoid: set[int]) -> int:
        with self._lock:
            live = [i for i in range(len(self.addresses)) if i not in self._down and i not in avoid]
            if not live:
                live = [i for i in range(len(self.addresses)) if i not in self._down]
            if not live:
                raise NoServerLeft(self._none_left())
            i = min(live, key=lambda j: (self._in_flight[j], j))
            self._in_flight[i] += 1
            return i

    def _piece(self, prompts: list[list[int]], gconfig: dict, seed: int) -> list[Generation]:
        tried: set[int] = set()
        errors: list[str] = []
        for attempt in range(self.retries + 1):
            i = self._pick(tried)
            try:
                answer = self._post(i, "/generate", {"prompts": prompts, "gconfig": gconfig, "seed": seed})
            except ServerDown as e:
                errors.append(f"{self.addresses[i]}: {e}")
                tried.add(i)
                self._mark_down(i)
                with self._lock:
                    self._stats["retries" if attempt < self.retries else "failures"] += 1
                continue
            finally:
                with self._lock:
                    self._in_flight[i] -= 1
            try:
                gens = [generation_from_json(g) for g in answer["generations"]]
            except (KeyError, TypeError, ValueError) as e:
                raise UserError(f"inference server {self.addresses[i]} answered /generate with a malformed body "
                                f"({e}); is it an areal_trainer server of the same version?") from None
            if len(gens) != len(prompts):
                raise UserError(f"inference server {self.addresses[i]} returned {len(gens)} answers for "
                                f"{len(prompts)} prompts.")
            return gens
        raise UserError(f"a generate request failed on {len(errors)} tries (rollout.request_retries="
                        f"{self.retries}): " + "; ".join(errors[-3:]))

    def _post(self, i: int, route: str, body: dict) -> dict:
        with self._lock:
            self._stats["requests"] += 1
        try:
            r = self._http.post(f"http://{self.addresses[i]}{route}", json=body)
        except httpx.TimeoutException:
            raise ServerDown(f"no answer within rollout.request_timeout={self.timeout:g} s") from None
        except httpx.TransportError as e:
            raise ServerDown(f"{type(e).__name__}: {e}") from None
        if r.status_code >= 500:
            raise ServerDown(f"HTTP {r.status_code}: {r.text[:300]}")
        if r.status_code >= 400:
            raise UserError(f"inference server {self.addresses[i]} refused {route} (HTTP {r.status_code}): "
                            f"{r.text[:500]}")
        return r.json()

    def _mark_down(self, i: int) -> None:
        with self._lock:
            if i in self._down:
                return
            self._down.add(i)
        if self.restart is not None:
            threading.Thread(target=self._bring_back, args=(i,), name=f"areal-server-restart-{i}",
                             daemon=True).start()

    def _bring_back(self, i: int) -> None:
        try:
            address = self.restart(i)
        except Exception:  # noqa: BLE001 - it stays down; the others serve
            return
        if address:
            self.addresses[i] = address
        with self._lock:
            self._stats["restarts"] += 1
        try:
            self.pusher.catch_up(self.addresses[i], self._version)
        except Exception:  # noqa: BLE001 - it takes the weights at the next update (a weight group re-forms then)
            with self._lock:
                self._restarted.add(i)
            return
        with self._lock:
            self._down.discard(i)

    def _none_left(self) -> str:
        return (f"every inference server is down ({', '.join(self.addresses)}); the run cannot sample. Check the "
                "servers' logs (the run directory's servers/ folder for servers the run started).")

    # -- for the pusher ----------------------------------------------------------------------------------
    def wait_healthy(self, deadline_s: float) -> None:
        """Wait until every server answers ``/health``; raises naming those that do not."""
        end = time.time() + deadline_s
        pending = set(range(len(self.addresses)))
        while pending and time.time() < end:
            for i in sorted(pending):
                try:
                    if self._http.get(f"http://{self.addresses[i]}/health", timeout=2.0).status_code == 200:
                        pending.discard(i)
                except httpx.HTTPError:
                    pass
            if pending:
                time.sleep(0.2)
        if pending:
            raise UserError(f"inference server(s) {', '.join(self.addresses[i] for i in sorted(pending))} did not "
                            f"answer GET /health within {deadline_s:g} s: is a server running there "
                            "(python -m areal_trainer.rollout.servers)?")
