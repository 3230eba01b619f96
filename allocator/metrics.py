"""Prometheus metrics of pools, for an application's own registry::

    from prometheus_client import REGISTRY
    from allocator.metrics import AllocatorCollector

    REGISTRY.register(AllocatorCollector([pool]))            # these pools
    REGISTRY.register(AllocatorCollector(client=r, prefix="alloc"))  # every pool, re-read

Each scrape reads every pool with ``status()`` and ``stats()`` (two script
runs that write nothing, so a read-only ACL user will do). The counters and
the wait histogram are kept in Redis by the scripts, so every process that
exports them shows the same figures. ``prometheus_client`` is imported only
when a scrape happens: the library itself does not depend on it (it comes
with the ``cli`` extra). The metrics are described in docs/operations.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any

from ._sync import FairAllocator
from ._values import PoolStats, PoolStatus

__all__ = ["STATES", "AllocatorCollector"]

_log = logging.getLogger("allocator")

#: The values of the ``state`` label of ``allocator_resources``.
STATES = ("free", "leased", "quarantined", "draining")


class AllocatorCollector:
    """A ``prometheus_client`` collector of pools.

    Either ``pools`` (``FairAllocator`` objects, each scraped), or ``client``
    (a blocking Redis client) and ``prefix``: every pool under the prefix,
    listed again at each scrape as pools come and go. A pool that cannot be
    read is left out of that scrape and logged on logger ``allocator``.
    """

    def __init__(
        self,
        pools: Iterable[FairAllocator] = (),
        *,
        client: Any = None,
        prefix: str = "alloc",
    ) -> None:
        self._pools = list(pools)
        self._client = client
        self._prefix = prefix
        if client is None and not self._pools:
            raise ValueError("AllocatorCollector needs pools, or a client to find every pool")

    def pools(self) -> list[FairAllocator]:
        if self._client is None:
            return self._pools
        names = FairAllocator.pools(self._client, prefix=self._prefix)
        return [FairAllocator(self._client, name, prefix=self._prefix) for name in names]

    def read(self) -> list[tuple[PoolStatus, PoolStats]]:
        """The figures of every pool (what one scrape shows)."""
        out = []
        for pool in self.pools():
            try:
                out.append((pool.status(), pool.stats()))
            except Exception:
                _log.warning("allocator: metrics: cannot read pool %r", pool.name, exc_info=True)
        return out

    def describe(self) -> list[Any]:
        # Registering must not read Redis: say nothing (prometheus_client
        # then takes the names from the first collect()).
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        resources = GaugeMetricFamily(
            "allocator_resources", "Resources in the pool, by state.", labels=["pool", "state"]
        )
        leases = GaugeMetricFamily("allocator_leases", "Live leases.", labels=["pool"])
        waiting = GaugeMetricFamily(
            "allocator_waiting", "Requesters in the queue.", labels=["pool"]
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
        wait = HistogramMetricFamily(
            "allocator_wait_seconds",
            "Time from entering the queue to the grant.",
            labels=["pool"],
        )
        for status, stats in self.read():
            name = status.name
            by_state = dict.fromkeys(STATES, 0)
            for row in status.resources:
                by_state[row.state] = by_state.get(row.state, 0) + 1
            for state, count in by_state.items():
                resources.add_metric([name, state], count)
            leases.add_metric([name], status.leased)
            waiting.add_metric([name], status.waiting)
            oldest.add_metric([name], status.oldest_wait)
            for field, family in counters.items():
                family.add_metric([name], getattr(stats, field))
            buckets = [
                ("+Inf" if math.isinf(bound) else repr(float(bound)), count)
                for bound, count in stats.wait_seconds
            ]
            wait.add_metric([name], buckets, stats.wait_seconds_sum)
        yield from (resources, leases, waiting, oldest, *counters.values(), wait)
