# generated from allocator/_async_admin.py by docs/scripts/async_to_sync.py: do not edit
"""The base of `FairAllocator`: the driver that carries out a flow's
steps, and the administration and views of a pool (``extend`` to
``pools``); the allocator adds its construction and leasing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ._core.keys import pool_names, pools_pattern
from ._core.pool import Pool
from ._core.presence import presence_budget
from ._core.retry import RETRY_BUDGET
from ._core.steps import Command, Flow, Step
from ._scripts import Scripts, scripts
from ._sync_io import drive, run_step
from ._sync_reader import Reader, reader_for
from ._transport import is_cluster
from ._values import ClientInfo, GCReport, LeaseInfo, PoolStats, PoolStatus

__all__ = ["Admin"]

T = TypeVar("T")
A = TypeVar("A")


class Admin:
    """The driver and the administration of :class:`FairAllocator
    <allocator.FairAllocator>`, which sets these three up."""

    _pool: Pool
    _client: Any
    _scripts: Scripts

    # -- the driver: the only place that does I/O --------------------------

    def _drive(self, steps: Flow[T]) -> T:
        return drive(steps, self._step)

    def _step(self, step: Step) -> Any:
        return run_step(self._client, self._scripts, step, self._reader)

    def _reader(self) -> Reader:
        return reader_for(self._client, self._pool)

    def _waiting(
        self,
        reader: Reader,
        make: Callable[[str, float], A],
        timeout: float | None,
    ) -> A:
        """An acquire's flow, made by ``make`` from the client's id (its
        arguments are checked there, before any I/O); on the client's first
        wait in the pool its presence is set up, and the flow made again
        with the id that goes with it."""
        started = time.monotonic()
        cid = reader.known_cid(self._pool)
        flow = make(cid, started)
        if not reader.joined(self._pool):
            reader.join(self._pool, presence_budget(timeout))
        # The id as decided now: by this join, or by another waiter's that
        # ended after the first look (a waiter of the plain id would then
        # wait where the reader no longer reads nor keeps it alive, and its
        # grant be taken back).
        decided = reader.known_cid(self._pool)
        if decided != cid:
            flow = make(decided, started)
        return flow

    def _drive_waiting(self, reader: Reader, lid: str, steps: Flow[T]) -> T:
        """Drive an acquire's flow with its waiter ``lid`` known to the
        reader (messages for it are routed to it) until the flow ends."""
        reader.register(self._pool, lid)
        try:
            return self._drive(steps)
        finally:
            reader.unregister(lid)

    # -- administration -------------------------------------------------------

    def extend(
        self,
        resources: Iterable[str],
        *,
        capacity: int = 1,
        priority: float = 0,
        rate: tuple[int, float] | None = None,
    ) -> int:
        """Add resources, or update existing ones; returns how many are new.

        - `resources`: an iterable of `str` (not a single string), each 1 to
          1024 printable characters; duplicates are ignored.
        - `capacity`: how many leases a resource may have at once (an int from 1
          to 2^31).
        - `priority`: a number within ±10^15; among free resources, a higher
          priority is granted first, and among equal priorities the one free for
          longest.
        - `rate`: `(count, seconds)`: at most `count` grants (1 to 1,000,000) in
          any window of `seconds`; None: no limit.

        Idempotent. Existing resources keep their leases and take the given
        `capacity`, `priority` and `rate`, the defaults included: `extend(names)`
        without them resets those settings
        ([concepts](concepts.md#settings-are-replaced-not-merged)). A capacity
        lowered below a resource's live leases keeps them; the resource gets no
        new grant until it is below the new capacity. A draining resource is
        taken back into rotation; a resource removed and added again continues
        its token sequence. Waiters are served at once if the change lets them.

        A large call is sent in runs of 100 names, each one atomic script run: a
        call that fails part-way leaves the earlier runs applied, and may simply
        be made again. After a retry, the count leaves out the names that a lost
        attempt added.
        """
        return self._drive(self._pool.extend(resources, capacity, priority, rate))

    def remove(self, resources: Iterable[str], *, force: bool = False) -> int:
        """Take resources out of the pool; returns how many were removed or marked
        draining (unknown names are ignored and not counted).

        A free resource leaves at once; a leased one stops being granted and
        leaves when its leases end (draining). `force=True` removes it now and
        revokes its leases: their holders' [`lost`][] turns true, [`renew`][]
        and the exit of [`lease`][] raise [`LeaseLost`][], and [`release`][]
        returns False. A resource added again later continues its token
        sequence; the revoked leases stay void. Revoked leases count in
        `stats().revoked`.

        Every name is checked before anything is sent. Like [`extend`][], a
        large call is applied in steps of 100 names, each one atomic script run
        of about 2 ms on the server, so that none blocks the server for long
        however many names are given: an error midway (raised) leaves the
        earlier steps applied, and the same call may simply be made again.
        """
        return self._drive(self._pool.remove(resources, force))

    def bind(self, name: str, resource: str) -> None:
        """Bind `name` to `resource` for the pool's `bind_ttl` seconds: the soft
        binding that `acquire(bind=name)` follows
        ([concepts](concepts.md#soft-binding)). Raises [`UnknownResource`][] if
        the resource is not in the pool."""
        return self._drive(self._pool.bind(name, resource))

    def unbind(self, name: str) -> bool:
        """Drop the soft binding of `name`; True if there was a live one."""
        return self._drive(self._pool.unbind(name))

    def status(self) -> PoolStatus:
        """A snapshot of the pool ([`PoolStatus`][]): its size, free resources,
        live leases, waiters and bindings, and one row per resource.

        It writes nothing (and loads no Functions library), so that a user whose
        ACL allows only reads may call it
        ([operations](operations.md#a-read-only-user-for-monitoring)): a lease
        past its deadline that nobody reclaimed yet is not counted, a quarantine
        that ended shows as over, and a pool that does not exist reads as empty
        (`size == 0`, `exists == False`) without a key being made.

        The resources are read 250 per script run, so that no run blocks the
        server for long however large the pool: a pool of up to 250 resources is
        one consistent snapshot; a larger one is read page by page, each page as
        of its own run, and the figures of the queue and the bindings are those
        of the first page.
        """
        return self._drive(self._pool.status())

    def gc(self) -> GCReport:
        """Reclaim leases past their deadline, drop queue entries of waiters that
        are gone, expire stale bindings and liveness marks, end quarantines and
        rate throttles that are over, clean up pending queue entries with no
        lease behind them, set right lease counts that disagree with the live
        leases, and serve the waiters that can now be served: [`GCReport`][]
        counts each.

        It runs in bounded steps until nothing is left due. Waiters of clients
        found absent whose grace still runs are waited for (a grace at most, about
        a second) and looked at again, so that one call leaves no dead waiter
        behind. Safe to run from any number of processes at once. A server error
        (an ACL that refuses `XRANGE`, say) is raised
        ([operations](operations.md#garbage-collection)).
        """
        return self._drive(self._pool.gc())

    # -- seeing and steering ---------------------------------------------------

    def leases(self) -> tuple[LeaseInfo, ...]:
        """Every live lease ([`LeaseInfo`][]): its resource, token, owner, grant
        time, deadline, whether its holder is connected and its client id, never
        its lease id; sorted by resource, then grant time. Read 250 leases per
        script run; writes nothing, so that a read-only user may call it."""
        return self._drive(self._pool.leases())

    def clients(self) -> tuple[ClientInfo, ...]:
        """Every client process of the pool (one per Redis client object and
        process, [`ClientInfo`][]) that waits, holds a lease, or waited lately:
        its id, the host, pid and library version it gave when it joined, whether
        it is connected, how long it has been silent, its waiters and leases,
        and whether it is *stalled* (connected and waiting, but silent past its
        heartbeat: stopped, paused or blocked). Read a page at a time; writes
        nothing, so that a read-only user may call it. On the command line:
        `allocator clients`
        ([operations](operations.md#allocator-leases-clients-revoke))."""
        return self._drive(self._pool.clients())

    def stats(self) -> PoolStats:
        """The pool's counters since it was created ([`PoolStats`][]): grants,
        timeouts, reclaimed and revoked leases, dropped waiters, quarantines and
        the wait histogram, kept in Redis by the scripts, so that every process
        sees the same figures. Writes nothing, so that a read-only user may call
        it."""
        return self._drive(self._pool.stats())

    def quarantine(self, resource: str, seconds: float) -> None:
        """Take `resource` out of rotation for `seconds` without holding a lease (an
        operator's "this proxy is broken"). Live leases on it stay valid; it gets
        no new grant until the time ends, then waiters are served. A longer
        quarantine or rate throttle already running is kept; a draining resource
        stays draining. Raises [`UnknownResource`][] if it is not in the pool. On
        the command line: `allocator quarantine POOL RESOURCE --for SECONDS`."""
        return self._drive(self._pool.quarantine(resource, seconds))

    def unquarantine(self, resource: str) -> bool:
        """End the quarantine of `resource` now (an operator's "this proxy works
        again"), whether an operator's [`quarantine`][] or a release's
        `quarantine=` started it: the resource is back in rotation at once and
        waiters are served. True if a quarantine ended, False if the resource was
        not quarantined. A rate throttle is the resource's own budget and is not
        ended: a resource whose budget is spent stays throttled until it refills.
        A draining resource stays draining. Raises [`UnknownResource`][] if it is
        not in the pool. On the command line:
        `allocator quarantine POOL RESOURCE --end`."""
        return self._drive(self._pool.unquarantine(resource))

    def set_events(self, maxlen: int | None) -> None:
        """Switch the pool's event log on, keeping about the `maxlen` latest events
        (1 to 10,000,000; older ones are trimmed), or off (None). Off by default;
        the setting is kept with the pool, for every process that uses it, and
        switched off, the entries already written stay until the pool is deleted.
        Each grant, release, expiry, reclaim, revocation, quarantine and dropped
        waiter then adds an entry to the Redis Stream [`events_key`][]. On the
        command line: `allocator events POOL --enable N` or `--disable`, and
        `allocator events POOL` reads it
        ([operations](operations.md#event-log))."""
        return self._drive(self._pool.set_events(maxlen))

    def set_order(self, order: str) -> None:
        """Set the pool's order, kept with the pool for every process that uses
        it: `"fifo"` (the default) serves requests in arrival order; `"tenant"`
        shares the resources fairly between the tenants the requests name
        ([`acquire`][]'s `tenant`): when a resource frees, it goes to the first
        waiter of the waiting tenant that has had the least service, weighted
        by [`set_tenant_weight`][] (start-time fair queueing over tenants;
        within a tenant, arrival order). It changes who is served next, never a
        grant already made. A switch to `"tenant"` puts the requests already
        waiting in its index, a bounded script run at a time, before it returns
        (`status().order` says `"building"` meanwhile, and the queue is served
        in arrival order); a switch to `"fifo"` is one call. On the command
        line: `allocator order POOL tenant|fifo`
        ([tenants](concepts.md#tenants))."""
        return self._drive(self._pool.set_order(order))

    def set_tenant_weight(self, tenant: str, weight: float) -> None:
        """Give `tenant` (`""`: requests that name none) a weight, a number from
        0.01 to 100 (default 1), kept with the pool: under the order `"tenant"`
        each grant adds 1/weight to its tenant's count, so under sustained load
        tenants are served in proportion to their weights. It applies from the
        tenant's next grant on. On the command line:
        `allocator weight POOL TENANT WEIGHT`."""
        return self._drive(self._pool.set_weight(tenant, weight))

    @property
    def events_key(self) -> str:
        """The name of the pool's event log, a Redis Stream (`XRANGE`, `XREAD`;
        `allocator events` reads it): entries with fields `kind`, `resource`,
        `token`, `client` (and `owner` for a grant or a drop), whose id is the
        server time in ms; never the lease id."""
        return self._pool.events_key

    def revoke(
        self, resource: str | None = None, token: int | None = None, *, lease_id: str | None = None
    ) -> bool:
        """End one lease now (an operator's "this holder must let go"): the
        resource keeps its capacity, priority and rate, and goes to the next
        waiter at once.

        An operator names the lease as [`leases`][] and `allocator leases` show
        it: by its `resource` and, where the resource holds several leases, its
        fencing `token` (a token names one grant). Without a token, a resource
        that holds several raises [`SeveralLeases`][] (a `ValueError`) listing
        their tokens, and nothing is revoked. The holder's own code may name its
        lease by `lease_id=` (`Lease.id`) instead. The lease is found in one
        script run, through the index of live leases.

        The holder is told at once through its presence connection: [`lost`][]
        turns true there; it also learns it at its next [`renew`][]
        ([`LeaseLost`][]) or [`release`][] (False), and the exit of its
        [`lease`][] block raises `LeaseLost`; its fencing token guards the rest.
        True if a live lease ended; False if none matched (it ended already, or
        the token is not a live lease's). Counted in `stats().revoked`. On the
        command line: `allocator revoke POOL RESOURCE [--token T]`."""
        return self._drive(self._pool.revoke(resource, token, lease_id))

    def delete(self, *, force: bool = False) -> bool:
        """Remove the pool and every key it has; False if there was no such pool.

        While leases are live or requesters wait, raises [`AllocatorError`][]
        and changes nothing, unless `force=True`: then the holders lose their
        leases ([`lost`][] turns true, [`renew`][] raises [`LeaseLost`][],
        [`release`][] returns False) and every waiting `acquire` raises
        [`AcquireTimeout`][] at once.
        """
        return self._drive(self._pool.delete(force))

    @staticmethod
    def pools(client: Any, *, prefix: str = "alloc") -> list[str]:
        """The names of the pools under `prefix` on the server of `client` (on a
        Redis Cluster: on every master), sorted. A static method; uses `SCAN`,
        writes nothing."""
        pattern = pools_pattern(prefix)
        if is_cluster(client):
            nodes = client.PRIMARIES
            scan = client.scan_iter(match=pattern, count=1000, target_nodes=nodes)
            return pool_names([key for key in scan], prefix)
        # Each SCAN is a single call: its reply comes within the budget of one.
        found: list[Any] = []
        cursor = 0
        while True:
            args = ("SCAN", str(cursor), "MATCH", pattern, "COUNT", "1000")
            step = Command(args, time.monotonic() + RETRY_BUDGET)
            cursor, batch = run_step(client, scripts(), step, None)
            found.extend(batch)
            if not cursor:
                return pool_names(found, prefix)
