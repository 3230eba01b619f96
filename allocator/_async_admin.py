# the source of allocator/_sync_admin.py: run docs/scripts/async_to_sync.py after an edit
"""The base of `AsyncFairAllocator`: the driver that carries out a flow's
steps, and the administration and views of a pool (``extend`` to
``pools``); the allocator adds its construction and leasing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, TypeVar

from ._async_io import Reader, drive, reader_for, run_step
from ._core.keys import pool_names, pools_pattern
from ._core.pool import Pool
from ._core.retry import RETRY_BUDGET
from ._core.steps import Command, Flow, Step
from ._scripts import Scripts, scripts
from ._transport import is_cluster
from ._values import ClientInfo, GCReport, LeaseInfo, PoolStats, PoolStatus

__all__ = ["AsyncAdmin"]

T = TypeVar("T")


class AsyncAdmin:
    """The driver and the administration of :class:`AsyncFairAllocator
    <allocator.AsyncFairAllocator>`, which sets these three up."""

    _pool: Pool
    _client: Any
    _scripts: Scripts

    # -- the driver: the only place that does I/O --------------------------

    async def _drive(self, steps: Flow[T]) -> T:
        return await drive(steps, self._step)

    async def _step(self, step: Step) -> Any:
        return await run_step(self._client, self._scripts, step, self._reader)

    def _reader(self) -> Reader:
        return reader_for(self._client, self._pool)

    # -- administration -------------------------------------------------------

    async def extend(
        self,
        resources: Iterable[str],
        *,
        capacity: int = 1,
        priority: float = 0,
        rate: tuple[int, float] | None = None,
    ) -> int:
        """Add resources, or update existing ones; returns how many are new.

        Existing resources keep their leases and take the new ``capacity``
        (leases at once), ``priority`` (higher is granted first) and ``rate``
        (``(count, seconds)``: at most ``count`` grants in any window of
        ``seconds``; None: no limit). Waiters are served at once if the new
        resources let them.
        """
        return await self._drive(self._pool.extend(resources, capacity, priority, rate))

    async def remove(self, resources: Iterable[str], *, force: bool = False) -> int:
        """Take resources out of the pool; returns how many were removed or
        marked (unknown names are ignored and not counted).

        A free resource leaves at once; a leased one stops being granted and
        leaves when its leases end (draining). ``force=True`` revokes its
        leases now: their holders get :class:`~allocator.LeaseLost`.

        Every name is checked before anything is sent. A large remove is
        applied in steps of 100 names, each one atomic script run, so that
        none blocks the server for long: an error midway (raised) leaves the
        earlier steps applied, and the same call may simply be made again.
        """
        return await self._drive(self._pool.remove(resources, force))

    async def bind(self, name: str, resource: str) -> None:
        """Bind ``name`` to ``resource`` (soft binding, see ``acquire``);
        raises :class:`~allocator.UnknownResource` if it is not in the pool."""
        return await self._drive(self._pool.bind(name, resource))

    async def unbind(self, name: str) -> bool:
        """Drop the binding of ``name``; True if there was one."""
        return await self._drive(self._pool.unbind(name))

    async def status(self) -> PoolStatus:
        """A consistent snapshot of the pool, one row per resource."""
        return await self._drive(self._pool.status())

    async def gc(self) -> GCReport:
        """Reclaim leases past their deadline, drop queue entries of waiters
        that are gone, expire stale bindings, and serve waiters that can now
        be served. Safe to run from any number of processes at once."""
        return await self._drive(self._pool.gc())

    # -- seeing and steering ---------------------------------------------------

    async def leases(self) -> tuple[LeaseInfo, ...]:
        """Every live lease: resource, token, owner, granted_at, expires_at
        (never the lease id). Writes nothing: a read-only user may call it."""
        return await self._drive(self._pool.leases())

    async def clients(self) -> tuple[ClientInfo, ...]:
        """Every client process of the pool (one per allocator object and
        process) that waits, holds a lease, or waited lately: its id, the
        host, pid and library version it gave when it joined, whether it is
        connected, how long it has been silent, its waiters and leases, and
        whether it is *stalled* (connected and waiting, but silent past its
        heartbeat: stopped, paused or blocked). Writes nothing: a read-only
        user may call it (docs/operations.md#clients)."""
        return await self._drive(self._pool.clients())

    async def stats(self) -> PoolStats:
        """The pool's counters since it was created (grants, timeouts,
        reclaimed, revoked, dropped waiters, the wait histogram), as the
        scripts keep them in Redis. Writes nothing."""
        return await self._drive(self._pool.stats())

    async def quarantine(self, resource: str, seconds: float) -> None:
        """Take ``resource`` out of rotation for ``seconds`` without holding a
        lease. Live leases on it stay valid; it gets no new grant until the
        time ends. Raises :class:`~allocator.UnknownResource` if it is not
        in the pool; a draining resource stays draining."""
        return await self._drive(self._pool.quarantine(resource, seconds))

    async def unquarantine(self, resource: str) -> bool:
        """End the quarantine of ``resource`` now (an operator's "it works
        again"): it is back in rotation at once and waiters are served.
        True if a quarantine ended, False if it was not quarantined (a rate
        throttle is the resource's own budget and stays; a draining resource
        stays draining). Raises :class:`~allocator.UnknownResource` if it is
        not in the pool."""
        return await self._drive(self._pool.unquarantine(resource))

    async def set_events(self, maxlen: int | None) -> None:
        """Switch the pool's event log on, keeping about the ``maxlen``
        latest events (1 to 10,000,000; older ones are trimmed), or off
        (None). The setting is kept with the pool, for every process that
        uses it: each grant, release, expiry, reclaim, revocation,
        quarantine and dropped waiter then adds an entry to the Redis
        Stream :attr:`events_key` (its resource, token, client id and time;
        never the lease id). Off by default; switched off, the entries
        already written stay until the pool is deleted. See the event log in
        docs/operations.md."""
        return await self._drive(self._pool.set_events(maxlen))

    @property
    def events_key(self) -> str:
        """The name of the pool's event log, a Redis Stream (``XRANGE``,
        ``XREAD``; ``allocator events`` reads it): entries with fields
        ``kind``, ``resource``, ``token``, ``client`` (and ``owner`` for a
        grant or a drop), whose id is the server time in ms."""
        return self._pool.events_key

    async def revoke(
        self, resource: str | None = None, token: int | None = None, *, lease_id: str | None = None
    ) -> bool:
        """End one lease now (an operator's "this holder must let go"): the
        resource keeps its capacity, priority and rate, and goes to the next
        waiter at once.

        The lease is named as ``leases()`` and ``status`` show it: by its
        ``resource`` and, where the resource holds several leases, its
        fencing ``token`` (a token names one grant). Without a token, a
        resource that holds several raises :class:`~allocator.SeveralLeases`
        (a ``ValueError``) listing their tokens, and nothing is revoked. The
        holder's own code may name it by ``lease_id=`` (``Lease.id``).

        The holder is told at once through its presence connection:
        :meth:`lost` turns true there (docs/api.md#lost); it also learns it
        at its next renew (:class:`~allocator.LeaseLost`) or release
        (False), and the exit of its ``lease()`` block raises
        ``LeaseLost``. True if a live lease ended; False if none matched
        (it ended already, or the token is not a live lease's)."""
        return await self._drive(self._pool.revoke(resource, token, lease_id))

    async def delete(self, *, force: bool = False) -> bool:
        """Remove the pool and every key it has; False if there was none.

        While leases are live or requesters wait, raises
        :class:`~allocator.AllocatorError` and changes nothing, unless
        ``force=True``: then holders get :class:`~allocator.LeaseLost` and
        waiters :class:`~allocator.AcquireTimeout`.
        """
        return await self._drive(self._pool.delete(force))

    @staticmethod
    async def pools(client: Any, *, prefix: str = "alloc") -> list[str]:
        """The names of the pools under ``prefix`` on this server (on a Redis
        Cluster: on every master), sorted. Writes nothing (SCAN)."""
        pattern = pools_pattern(prefix)
        if is_cluster(client):
            nodes = client.PRIMARIES
            scan = client.scan_iter(match=pattern, count=1000, target_nodes=nodes)
            return pool_names([key async for key in scan], prefix)
        # Each SCAN is a single call: its reply comes within the budget of one.
        found: list[Any] = []
        cursor = 0
        while True:
            args = ("SCAN", str(cursor), "MATCH", pattern, "COUNT", "1000")
            step = Command(args, time.monotonic() + RETRY_BUDGET)
            cursor, batch = await run_step(client, scripts(), step, None)
            found.extend(batch)
            if not cursor:
                return pool_names(found, prefix)
