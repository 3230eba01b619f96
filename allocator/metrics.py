"""Prometheus metrics of pools, for an application's own registry::

    from prometheus_client import REGISTRY
    from allocator.metrics import AllocatorCollector

    REGISTRY.register(AllocatorCollector([pool]))            # these pools
    REGISTRY.register(AllocatorCollector(client=r, prefix="alloc"))  # every pool, re-read

Each scrape reads every pool with ``status()``, ``stats()`` and
``clients()`` (script runs that write nothing, so a read-only ACL user will do); with
``interval=``, a thread of the collector reads them in the background and a
scrape serves the last reading from memory, so that a scrape never waits on
Redis (``allocator metrics`` does so). The counters and
the wait histogram are kept in Redis by the scripts, so every process that
exports them shows the same figures. ``prometheus_client`` is imported only
when a scrape happens: the library itself does not depend on it (it comes
with the ``cli`` extra). The metrics are described in docs/operations.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import redis
from redis.cluster import RedisCluster

from ._sync import FairAllocator
from ._values import PoolStats, PoolStatus

__all__ = ["DEFAULT_PER_RESOURCE_LIMIT", "STATES", "AllocatorCollector"]

_log = logging.getLogger("allocator")

#: The values of the ``state`` label of ``allocator_resources`` and
#: ``allocator_resource_state``.
STATES = ("free", "leased", "quarantined", "draining")

#: Above this many resources in a pool, its per-resource series
#: (``allocator_resource_state``, ``allocator_resource_leases``: five series a
#: resource) are left out, and a warning says so once.
DEFAULT_PER_RESOURCE_LIMIT = 1000


@attrs.frozen
class _Reading:
    """One pool in one scrape: its figures, or None when it could not be read."""

    name: str
    status: PoolStatus | None = None
    stats: PoolStats | None = None
    #: Clients connected, waiting and silent past their heartbeat.
    stalled: int = 0


@attrs.frozen
class _Scrape:
    """What one scrape found. ``listed``: None for a collector of given
    pools, else whether the pools under the prefix could be listed."""

    readings: list[_Reading]
    listed: bool | None


class _NoPool(Exception):
    """A pool given by name that does not exist (yet, or any more)."""


class AllocatorCollector:
    """A `prometheus_client` collector of pools: register it in your
    registry. The metrics are listed in [operations](operations.md#metrics).

    Either `pools` (`FairAllocator` objects, each scraped), or `client` (a
    blocking Redis client) and `prefix`: every pool under the prefix,
    listed again at each scrape as pools come and go.

    `allocator_up{pool}` is 1 for a pool read in this scrape, 0 for one that
    could not be (the server down or refusing): a collector given a client
    then reports the pools of its last listing, and `allocator_up` without a
    `pool` label says whether the listing itself worked. A pool or listing
    that cannot be read is logged as one warning on logger `allocator` when
    it starts failing, and one info line when it can be read again, not at
    every scrape.

    `per_resource` (default True) adds a pool's resources one by one
    (`allocator_resource_state`, `allocator_resource_leases`), for pools of
    at most `per_resource_limit` resources (None: any size); a larger pool
    gets only its pool-wide series, and a warning says so once.

    A pool given by name that does not exist (yet) is `allocator_up 0`
    until it is made, logged once like a pool that cannot be read.

    `interval` (seconds; default None) reads the pools in the background:
    a daemon thread reads them every `interval` seconds (each read bounded
    by the library's own deadlines), and a scrape answers at once from the
    last reading, whatever the server does, never waiting on Redis nor on
    another scrape. `allocator_scrape_age_seconds{pool}` is then the age
    of a pool's last good reading, and a pool is `allocator_up 0` when its
    last reading failed or is older than `stale` seconds (default three
    intervals and 2 s: a server that hangs). `close()` stops the thread.
    Without `interval`, each scrape reads the pools itself (and waits on
    them), and the age is 0.

    `prometheus_client` is imported only when a scrape happens: the library
    itself does not depend on it (the `cli` extra brings it).
    """

    def __init__(
        self,
        pools: Iterable[FairAllocator] = (),
        *,
        client: Any = None,
        prefix: str = "alloc",
        per_resource: bool = True,
        per_resource_limit: int | None = DEFAULT_PER_RESOURCE_LIMIT,
        interval: float | None = None,
        stale: float | None = None,
    ) -> None:
        for arg, value in (("interval", interval), ("stale", stale)):
            if value is not None and (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not 0 < value < math.inf
            ):
                raise ValueError(f"{arg} must be a number of seconds > 0 or None, not {value!r}")
        if stale is not None and interval is None:
            raise ValueError("stale needs interval (a background reading)")
        if not isinstance(per_resource, bool):
            raise TypeError(f"per_resource must be a bool, not {type(per_resource).__name__}")
        if per_resource_limit is not None and (
            not isinstance(per_resource_limit, int)
            or isinstance(per_resource_limit, bool)
            or per_resource_limit < 1
        ):
            raise ValueError(
                f"per_resource_limit must be an int >= 1 or None, not {per_resource_limit!r}"
            )
        self._pools = list(pools)
        self._client = client
        self._prefix = prefix
        self._per_resource = per_resource
        self._limit = per_resource_limit
        if client is None and not self._pools:
            raise ValueError("AllocatorCollector needs pools, or a client to find every pool")
        # Scrapes may come from several threads (prometheus_client's own
        # server is threaded): the memory of what failed is shared.
        self._lock = threading.Lock()
        self._listed_names: list[str] = []
        self._unreadable: set[str] = set()  # "" stands for the listing
        self._over_limit: set[str] = set()
        # The background reading: the last one, and when (time.monotonic())
        # each pool ("" the listing) was last read.
        self._interval = interval
        self._stale = (
            None if interval is None else (stale if stale is not None else 3 * interval + 2.0)
        )
        self._latest: _Scrape | None = None
        self._read_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        if interval is not None:
            self._thread = threading.Thread(
                target=self._read_forever, name="allocator-metrics-reader", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop the background reading (a no-op without ``interval``)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def wait_first_reading(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first background reading
        to end (well or not); True if it did. Without ``interval``: True."""
        return self._thread is None or self._first.wait(timeout)

    def _read_forever(self) -> None:
        assert self._interval is not None
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._scrape()
            except Exception:  # a bug: keep reading, and say it once a reading
                _log.exception("allocator metrics: the background reading failed")
            self._first.set()
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def pools(self) -> list[FairAllocator]:
        """The pools a scrape reads: those given, or every pool under the
        prefix on the client, listed now."""
        if self._client is None:
            return self._pools
        names = FairAllocator.pools(self._client, prefix=self._prefix)
        return [FairAllocator(self._client, name, prefix=self._prefix) for name in names]

    def read(self) -> list[tuple[PoolStatus, PoolStats]]:
        """The figures of every pool that could be read (what one scrape shows)."""
        return [
            (r.status, r.stats)
            for r in self._scrape().readings
            if r.status is not None and r.stats is not None
        ]

    def describe(self) -> list[Any]:
        # Registering must not read Redis: say nothing (prometheus_client
        # then takes the names from the first collect()).
        return []

    # -- one scrape ---------------------------------------------------------------

    def _scrape(self) -> _Scrape:
        started = time.monotonic()
        failed: dict[str, BaseException] = {}
        listed: bool | None = None
        if self._client is None:
            pools = self._pools
        else:
            try:
                pools = self.pools()
            except Exception as exc:
                failed[""] = exc
                pools, listed = [], False
            else:
                listed = True
        readings: list[_Reading] = []
        down: BaseException | None = None
        for pool in pools:
            if down is not None and not isinstance(pool.client, RedisCluster):
                # The same server just failed to answer: asking again for
                # every pool would only make the scrape late (each call
                # retries for up to 2 s).
                failed[pool.name] = down
                readings.append(_Reading(pool.name))
                continue
            try:
                status = pool.status()
                if not status.exists:
                    raise _NoPool(f"no pool named {pool.name!r}, yet")
                stalled = sum(1 for c in pool.clients() if c.stalled)
                readings.append(_Reading(pool.name, status, pool.stats(), stalled))
            except Exception as exc:
                failed[pool.name] = exc
                readings.append(_Reading(pool.name))
                if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
                    down = exc
        with self._lock:
            if listed is True:
                self._listed_names = [p.name for p in pools]
                self._read_at[""] = started
            elif listed is False:
                # Nothing could be read: the pools seen last are down.
                readings = [_Reading(name) for name in self._listed_names]
                failed.update(dict.fromkeys(self._listed_names, failed[""]))
            self._report(failed, seen={r.name for r in readings} | {""})
            for r in readings:
                if r.status is not None:
                    self._read_at[r.name] = started
            kept = {r.name for r in readings} | {""}
            self._read_at = {n: at for n, at in self._read_at.items() if n in kept}
            scrape = _Scrape(readings, listed)
            self._latest = scrape
        return scrape

    def _served(self) -> tuple[_Scrape, dict[str, float]]:
        """What a scrape shows, and the age of each pool's last good reading
        ("" the listing): read now, or, in the background, the last reading,
        where a pool read too long ago counts as unread."""
        if self._interval is None:
            scrape = self._scrape()
            return scrape, {r.name: 0.0 for r in scrape.readings if r.status is not None}
        now = time.monotonic()
        with self._lock:
            latest, read_at = self._latest, dict(self._read_at)
        if latest is None:  # nothing read yet: what is known is unread
            names = [p.name for p in self._pools] if self._client is None else []
            latest = _Scrape([_Reading(n) for n in names], None if self._client is None else False)
        assert self._stale is not None
        age = {name: max(0.0, now - at) for name, at in read_at.items()}
        fresh = {name for name, a in age.items() if a <= self._stale}
        readings = [r if r.name in fresh else _Reading(r.name) for r in latest.readings]
        listed = latest.listed if latest.listed is None else latest.listed and "" in fresh
        return _Scrape(readings, listed), age

    def _report(self, failed: dict[str, BaseException], seen: set[str]) -> None:
        """Log what started failing, and what can be read again, once each."""
        new = [name for name in failed if name not in self._unreadable]
        back = sorted(name for name in self._unreadable if name in seen and name not in failed)
        if new:
            exc = failed[new[0]]
            known = isinstance(exc, (redis.RedisError, _NoPool))
            _log.warning(
                "allocator metrics: cannot read %s (%s); reported as allocator_up 0 until "
                "it can be read again",
                _which(new, self._prefix),
                _one_line(exc),
                exc_info=None if known else exc,  # a bug, not an outage: keep its traceback
            )
        if back:
            _log.info("allocator metrics: %s can be read again", _which(back, self._prefix))
        self._unreadable = (self._unreadable | set(new)) - set(back)
        self._unreadable &= seen | set(failed)

    def _per_resource_allowed(self, status: PoolStatus) -> bool:
        if not self._per_resource:
            return False
        over = self._limit is not None and len(status.resources) > self._limit
        with self._lock:
            if over and status.name not in self._over_limit:
                _log.warning(
                    "allocator metrics: pool %r has %d resources, more than the per-resource "
                    "limit (%d): its allocator_resource_* series are left out "
                    "(per_resource_limit=, allocator metrics --per-resource-limit)",
                    status.name,
                    len(status.resources),
                    self._limit,
                )
            if over:
                self._over_limit.add(status.name)
            else:
                self._over_limit.discard(status.name)
        return not over

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        up = GaugeMetricFamily(
            "allocator_up",
            "1 if the pool was read in this scrape, 0 if not (server down or refusing); "
            "without a pool label: whether the pools could be listed.",
            labels=["pool"],
        )
        resources = GaugeMetricFamily(
            "allocator_resources", "Resources in the pool, by state.", labels=["pool", "state"]
        )
        resource_state = GaugeMetricFamily(
            "allocator_resource_state",
            "1 for the resource's current state, 0 for the others.",
            labels=["pool", "resource", "state"],
        )
        resource_leases = GaugeMetricFamily(
            "allocator_resource_leases",
            "Live leases on the resource.",
            labels=["pool", "resource"],
        )
        leases = GaugeMetricFamily("allocator_leases", "Live leases.", labels=["pool"])
        absent = GaugeMetricFamily(
            "allocator_lease_holders_gone",
            "Live leases whose holder is not connected (its process died, or it is "
            "reconnecting): they end at their deadline.",
            labels=["pool"],
        )
        waiting = GaugeMetricFamily(
            "allocator_waiting", "Requesters in the queue.", labels=["pool"]
        )
        stalled = GaugeMetricFamily(
            "allocator_stalled_clients",
            "Client processes connected and waiting but silent past their heartbeat "
            "(stopped, paused or blocked).",
            labels=["pool"],
        )
        oldest = GaugeMetricFamily(
            "allocator_oldest_wait_seconds",
            "How long the head of the queue has waited (0 with nobody waiting).",
            labels=["pool"],
        )
        counters = {
            "grants": CounterMetricFamily(
                "allocator_grants", "Leases granted since the pool was created.", labels=["pool"]
            ),
            "timeouts": CounterMetricFamily(
                "allocator_timeouts",
                "Acquires that gave up (timeout, cancellation, interrupt).",
                labels=["pool"],
            ),
            "reclaimed": CounterMetricFamily(
                "allocator_reclaimed",
                "Leases that ended by expiry (their holder did not renew or release).",
                labels=["pool"],
            ),
            "revoked": CounterMetricFamily(
                "allocator_revoked", "Leases revoked by remove(force=True).", labels=["pool"]
            ),
            "dropped_waiters": CounterMetricFamily(
                "allocator_dropped_waiters",
                "Queue entries of requesters that were gone (crashed, stalled).",
                labels=["pool"],
            ),
        }
        quarantines = CounterMetricFamily(
            "allocator_quarantines",
            "Quarantines started, by cause: release (release(quarantine=)) or operator "
            "(quarantine()).",
            labels=["pool", "cause"],
        )
        wait = HistogramMetricFamily(
            "allocator_wait_seconds",
            "Time from entering the queue to the grant.",
            labels=["pool"],
        )
        age = GaugeMetricFamily(
            "allocator_scrape_age_seconds",
            "Seconds since the pool was last read (the exporter reads in the background "
            "and serves its last reading): 0 where each scrape reads; absent if never read.",
            labels=["pool"],
        )
        scrape, ages = self._served()
        if scrape.listed is not None:
            up.add_metric([""], 1 if scrape.listed else 0)
            if "" in ages:
                age.add_metric([""], round(ages[""], 3))
        for reading in scrape.readings:
            status, stats, name = reading.status, reading.stats, reading.name
            up.add_metric([name], 0 if status is None or stats is None else 1)
            if name in ages:
                age.add_metric([name], round(ages[name], 3))
            if status is None or stats is None:
                continue
            by_state = dict.fromkeys(STATES, 0)
            for row in status.resources:
                by_state[row.state] = by_state.get(row.state, 0) + 1
            for state, count in by_state.items():
                resources.add_metric([name, state], count)
            if self._per_resource_allowed(status):
                for row in status.resources:
                    for state in STATES:
                        resource_state.add_metric(
                            [name, row.name, state], 1 if row.state == state else 0
                        )
                    resource_leases.add_metric([name, row.name], row.leases)
            leases.add_metric([name], status.leased)
            absent.add_metric([name], status.absent_holders)
            stalled.add_metric([name], reading.stalled)
            waiting.add_metric([name], status.waiting)
            oldest.add_metric([name], status.oldest_wait)
            for field, family in counters.items():
                family.add_metric([name], getattr(stats, field))
            quarantines.add_metric([name, "release"], stats.quarantined_on_release)
            quarantines.add_metric([name, "operator"], stats.quarantined_by_operator)
            buckets = [
                ("+Inf" if math.isinf(bound) else repr(float(bound)), count)
                for bound, count in stats.wait_seconds
            ]
            wait.add_metric([name], buckets, stats.wait_seconds_sum)
        yield from (
            up,
            age,
            resources,
            resource_state,
            resource_leases,
            leases,
            absent,
            stalled,
            waiting,
            oldest,
            *counters.values(),
            quarantines,
            wait,
        )


def _which(names: Sequence[str], prefix: str) -> str:
    """``pool 'a'``, ``pools 'a', 'b' and 3 more``, or the listing."""
    shown = [f"{n!r}" for n in names if n]
    parts = []
    if "" in names:
        parts.append(f"the list of pools under prefix {prefix!r}")
    if shown:
        more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
        parts.append(("pool " if len(shown) == 1 else "pools ") + ", ".join(shown[:3]) + more)
    return " and ".join(parts)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
