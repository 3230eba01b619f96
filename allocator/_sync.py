"""`FairAllocator`: the blocking shell around the core."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar, overload

from ._core.keys import pool_names, pools_pattern
from ._core.pool import Pool
from ._core.presence import presence_budget
from ._core.retry import RETRY_BUDGET
from ._core.steps import Flow, Step
from ._scripts import scripts
from ._sync_io import drive, execute, run_step, senders_of
from ._sync_reader import Reader, reader_for, readers_of
from ._transport import (
    bound_client_retries,
    client_kind,
    is_cluster,
    is_sentinel,
    no_client_retries,
)
from ._values import ClientInfo, GCReport, Lease, LeaseInfo, PoolStats, PoolStatus
from .errors import LeaseLost

__all__ = ["FairAllocator"]

_log = logging.getLogger("allocator")

T = TypeVar("T")
S = TypeVar("S")
A = TypeVar("A")


class FairAllocator:
    """A pool of named resources shared through Redis, granted in strict
    first-come-first-served order.

    ``client`` is a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (or a
    fakeredis ``FakeRedis``), with ``decode_responses`` on or off, over RESP2
    or RESP3. Two allocators with the same server, ``prefix`` and ``name``
    are the same pool. Construction does no I/O.

    ``lease_ttl`` is the default life of a lease without renewal, in seconds;
    ``bind_ttl`` how long a soft binding lives after its last use.

    ``min_replicas`` (default 0: no wait): ``acquire`` and ``renew`` return
    only once that many replicas confirmed the write (Redis ``WAIT``, sent
    in the same round trip as the script, bounded by ``replica_timeout``
    seconds); else :class:`~allocator.NotReplicated` is raised, and an
    acquire releases its grant first.

    ``reclaim_on_disconnect`` (default False): a lease this allocator
    acquires ends once the server has seen its holder's process gone (its
    presence connection dropped, docs/concepts.md#presence-as-a-session)
    for the grace, about a second, instead of at its deadline, and the
    resource goes to the next waiter then. In return, this process gives up such a lease by
    itself once its own presence connection has been down longer than the
    grace (a partition, a restart the connection did not survive):
    ``renew`` and the exit of ``lease()`` raise
    :class:`~allocator.LeaseLost`, and ``release`` returns False. Where the
    client keeps no presence (fakeredis, the asyncio cluster client, an ACL
    without the channel) it has no effect (docs/operations.md,
    "Presence").

    A Sentinel-managed client (``Sentinel(...).master_for(...)``) is a client
    like any other, except that its calls without a deadline of their own
    (``release``, ``renew``, ``status``, ...) keep retrying for up to 45 s
    instead of 2 s: long enough to ride out a failover with Sentinel's
    default settings (docs/operations.md, "Sentinel").

    Every call keeps its deadline against a server that stops answering: a
    read from the socket waits no longer than what is left of the call's
    ``timeout`` or budget (on a ``RedisCluster`` client, only the client's
    own ``socket_timeout`` bounds a read).
    """

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        lease_ttl: float = 60.0,
        bind_ttl: float = 3600.0,
        prefix: str = "alloc",
        min_replicas: int = 0,
        replica_timeout: float = 0.5,
        reclaim_on_disconnect: bool = False,
    ) -> None:
        self._pool = Pool.create(
            name,
            lease_ttl=lease_ttl,
            bind_ttl=bind_ttl,
            prefix=prefix,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            reclaim_on_disconnect=reclaim_on_disconnect,
            sentinel=is_sentinel(client),
        )
        if client_kind(client) != "sync":
            raise TypeError(
                f"client must be a blocking Redis client for {type(self).__name__}, "
                f"got the asyncio {type(client).__module__}.{type(client).__qualname__}: "
                "use AsyncFairAllocator with it"
            )
        bound_client_retries(client)
        self._client = client
        self._scripts = scripts()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._pool.name!r}, prefix={self._pool.prefix!r})"

    @property
    def name(self) -> str:
        return self._pool.name

    def close(self) -> None:
        """End the background work of this allocator's client in this
        process, for a process that wants it gone before it exits: the
        reader's connection goes back to the client's pool, once the replies
        still due on it (the last acknowledgements) are read; a reader
        thread finishing rounds that no waiter was left to carry ends
        first, within about a heartbeat (1 s). A reader that other threads still wait on is
        left to them. Leases stay as they are (release them first; a
        ``lease()`` block's keepalive ends with its block), the client
        stays open (it is yours: ``client.close()``), and the allocator
        stays usable: a later wait starts a reader again. Also the exit of
        ``with FairAllocator(...) as pool:``.

        Cancels and releases of the client that could not be confirmed and
        are still being sent in the background (docs/api.md#release) get
        up to 2 s more to reach the server; what is still undelivered then
        is dropped (logged at warning): those leases end at their deadlines."""
        for reader in readers_of(self._client):
            reader.finish()
        for sender in senders_of(self._client):
            sender.close()

    def __enter__(self) -> FairAllocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> Any:
        return self._client

    # -- the driver: the only place that does I/O --------------------------

    def _drive(self, steps: Flow[T]) -> T:
        return drive(steps, self._step)

    def _step(self, step: Step) -> Any:
        return run_step(self._client, self._scripts, step, self._reader)

    def _reader(self) -> Reader:
        return reader_for(self._client, self._pool)

    def _waiting(self, reader: Reader, make: Callable[[str, float], A], timeout: float | None) -> A:
        """An acquire's flow, made by ``make`` from the client's id (its
        arguments are checked there, before any I/O); on the client's first
        wait in the pool its presence is set up, and the flow made again
        with the id that goes with it."""
        started = time.monotonic()
        flow = make(reader.known_cid(self._pool), started)
        if not reader.joined(self._pool):
            reader.join(self._pool, presence_budget(timeout))
            flow = make(reader.known_cid(self._pool), started)
        return flow

    def _drive_waiting(self, reader: Reader, lid: str, steps: Flow[T]) -> T:
        """Drive an acquire's flow with its waiter ``lid`` known to the
        reader (messages for it are routed to it) until the flow ends."""
        reader.register(self._pool, lid)
        try:
            return self._drive(steps)
        finally:
            reader.unregister(lid)

    # -- leasing --------------------------------------------------------------

    @overload
    def acquire(
        self,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        bind: str | None = ...,
        blocking: Literal[True] = ...,
        owner: str | None = ...,
    ) -> Lease: ...

    @overload
    def acquire(
        self,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        bind: str | None = ...,
        blocking: bool,
        owner: str | None = ...,
    ) -> Lease | None: ...

    def acquire(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        blocking: bool = True,
        owner: str | None = None,
    ) -> Lease | None:
        """Wait in line for a resource and lease it.

        Blocks until every requester that queued earlier has been served and
        a resource is free. ``timeout`` (seconds, None: no limit) bounds the
        wait and raises :class:`~allocator.AcquireTimeout`; the requester
        leaves the queue, and a grant that raced the timeout passes on.
        ``ttl``: the lease's life without renewal (default: ``lease_ttl``).
        ``bind``: soft binding, a name that keeps getting the same resource
        while it is free. ``blocking=False`` returns a lease only if one can
        be granted at once without passing anyone waiting, else None.

        Uncontended, this is one round trip to Redis; a waiter is woken by a
        push to its signal list, never by polling the pool. With Redis
        unreachable or hung, the call retries until ``timeout``, then leaves
        the queue (a try of at most 0.15 s of its own) and raises
        ``AcquireTimeout`` saying the whole time waited, the last transport
        error as its ``__cause__``; ``blocking=False`` lets that error
        through after 2 s.
        """
        reader = self._reader()
        flow = self._waiting(
            reader,
            lambda cid, t0: self._pool.acquire(
                timeout, ttl, bind, blocking, cid=cid, owner=owner, started=t0
            ),
            timeout,
        )
        lease = self._drive_waiting(reader, flow.lid, flow.steps)
        if lease is not None:
            reader.hold(self._pool, [lease])
        return lease

    @contextlib.contextmanager
    def lease(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        keepalive: bool = False,
        owner: str | None = None,
    ) -> Iterator[Lease]:
        """Acquire on entry, release on exit::

            with pool.lease(timeout=10) as proxy:
                fetch(url, proxy=proxy.resource, fence=proxy.token)

        If the lease was lost while the block ran (expired, revoked), exit
        raises :class:`~allocator.LeaseLost`; if the block raised, its
        exception propagates unchanged. ``keepalive=True`` renews the lease
        from a daemon thread every ``ttl/3`` while the block runs.
        """
        if not isinstance(keepalive, bool):
            raise TypeError(f"keepalive must be a bool, not {type(keepalive).__name__}")
        held = self.acquire(timeout, ttl=ttl, bind=bind, owner=owner)
        keeper = _Keeper(self, held) if keepalive else None
        try:
            yield held
        except BaseException:
            if keeper is not None:
                keeper.stop()
            with contextlib.suppress(Exception):
                self.release(held)
            raise
        lost = keeper.stop() if keeper is not None else None
        if not self.release(held) or lost is not None:
            raise lost or LeaseLost(self.name, held.resource, held.token, "lost while held")

    @overload
    def acquire_many(
        self,
        count: int,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        blocking: Literal[True] = ...,
        owner: str | None = ...,
    ) -> list[Lease]: ...

    @overload
    def acquire_many(
        self,
        count: int,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        blocking: bool,
        owner: str | None = ...,
    ) -> list[Lease] | None: ...

    def acquire_many(
        self,
        count: int,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        owner: str | None = None,
    ) -> list[Lease] | None:
        """Wait in line for ``count`` distinct resources and lease them all
        at once: all or nothing.

        The request takes one place in the same queue as ``acquire``. At
        the head of the queue it is granted when ``count`` resources are
        free at once, each with its own :class:`~allocator.Lease` and
        fencing token, in one step; until then those behind it wait too,
        so a stream of single requests never starves it. Renew and release
        each lease on its own. ``timeout``, ``ttl`` and ``blocking`` mean
        what they mean for ``acquire``, and so does ``owner`` (shown for
        every lease by ``leases()``); a timeout or an interrupt leaves
        nothing behind. ``count`` larger than the pool raises
        ``ValueError``.
        """
        reader = self._reader()
        flow = self._waiting(
            reader,
            lambda cid, t0: self._pool.acquire_many(
                count, timeout, ttl, blocking, cid=cid, owner=owner, started=t0
            ),
            timeout,
        )
        leases = self._drive_waiting(reader, flow.lid, flow.steps)
        if leases is not None:
            reader.hold(self._pool, leases)
        return leases

    @contextlib.contextmanager
    def lease_many(
        self,
        count: int,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        keepalive: bool = False,
        owner: str | None = None,
    ) -> Iterator[list[Lease]]:
        """``acquire_many`` on entry, release of every lease on exit::

            with pool.lease_many(2, timeout=60) as (a, b):
                train(gpus=[a.resource, b.resource])

        If any lease was lost while the block ran, exit raises
        :class:`~allocator.LeaseLost` (after releasing the others); if the
        block raised, its exception propagates unchanged. ``keepalive=True``
        renews every lease from daemon threads every ``ttl/3``.
        """
        if not isinstance(keepalive, bool):
            raise TypeError(f"keepalive must be a bool, not {type(keepalive).__name__}")
        held = self.acquire_many(count, timeout, ttl=ttl, owner=owner)
        keepers = [_Keeper(self, lease) for lease in held] if keepalive else []
        try:
            yield held
        except BaseException:
            for keeper in keepers:
                keeper.stop()
            for lease in held:
                with contextlib.suppress(Exception):
                    self.release(lease)
            raise
        losses = [keeper.stop() for keeper in keepers]
        released: list[bool | BaseException] = []
        for lease in held:  # every one, whatever happens to another
            try:
                released.append(self.release(lease))
            except Exception as exc:
                released.append(exc)
        failure = self._pool.lost_many(held, released, losses)
        if failure is not None:
            raise failure

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease:
        """Push the lease's deadline to now + ``ttl`` (default: the lease's
        own ttl) on the server clock. Returns the lease with its new
        ``expires_at``; raises :class:`~allocator.LeaseLost` if it is no
        longer held (a lease past its deadline is never brought back).
        With Redis unreachable or hung, retries for 5 s, or half the
        lease's ttl if less, never under 2 s (45 s on a Sentinel-managed
        client), then lets the transport error through. Raises
        ``LeaseLost`` without asking the server once this process gave the
        lease up (``reclaim_on_disconnect``), or while its release is still
        being delivered (docs/api.md#renew)."""
        reader = self._reader()
        renewed = self._drive(self._pool.renew(lease, ttl, reader.lost))
        reader.renewed(renewed)
        return renewed

    def lost(self, lease: Lease) -> bool:
        """Whether this process knows that ``lease`` ended, without asking
        the server (no I/O): true within a few ms of a revoke, a reclaim
        (past its deadline, or its holder found gone), or a forced remove
        or delete, whose script tells the holder on its presence connection
        while it is connected; and once a lease acquired with
        ``reclaim_on_disconnect`` was given up because this process's
        presence stayed suspended for a safe part of the grace, always
        before the server may end it and grant its resource again
        (docs/concepts.md, "Presence as a session"). Then ``renew`` raises
        ``LeaseLost`` without asking (a keepalive stops), and so does the
        exit of the ``lease()`` block. A holder in the middle of long work
        checks it between steps, and sends its fencing token with every
        write, which fences anything that slips through (docs/api.md#lost).
        False proves nothing: the word may not have reached a process that
        is disconnected or stopped."""
        return self._reader().lost(lease)

    def release(self, lease: Lease, *, quarantine: float | None = None) -> bool:
        """End the lease and hand the resource to the next waiter.

        True if the lease was live and is now released; False if it had
        already ended (expired, revoked, or released before). ``quarantine``
        keeps the resource out of rotation for that many seconds; waiters
        are woken and served when it ends. With Redis unreachable or hung,
        retries for 5 s (45 s on a Sentinel-managed client), then lets the
        transport error through: the outcome is not known yet, and the
        release is sent again in the background as soon as the server
        answers (docs/api.md#release). Under ``reclaim_on_disconnect``, a
        lease this process gave up is released all the same, and False is
        returned.
        """
        reader = self._reader()
        released = self._drive(self._pool.release(lease, quarantine, reader.lost))
        reader.unhold(lease)
        return released

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

        Existing resources keep their leases and take the new ``capacity``
        (leases at once), ``priority`` (higher is granted first) and ``rate``
        (``(count, seconds)``: at most ``count`` grants in any window of
        ``seconds``; None: no limit). Waiters are served at once if the new
        resources let them.
        """
        return self._drive(self._pool.extend(resources, capacity, priority, rate))

    def remove(self, resources: Iterable[str], *, force: bool = False) -> int:
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
        return self._drive(self._pool.remove(resources, force))

    def bind(self, name: str, resource: str) -> None:
        """Bind ``name`` to ``resource`` (soft binding, see ``acquire``);
        raises :class:`~allocator.UnknownResource` if it is not in the pool."""
        return self._drive(self._pool.bind(name, resource))

    def unbind(self, name: str) -> bool:
        """Drop the binding of ``name``; True if there was one."""
        return self._drive(self._pool.unbind(name))

    def status(self) -> PoolStatus:
        """A consistent snapshot of the pool, one row per resource."""
        return self._drive(self._pool.status())

    def gc(self) -> GCReport:
        """Reclaim leases past their deadline, drop queue entries of waiters
        that are gone, expire stale bindings, and serve waiters that can now
        be served. Safe to run from any number of processes at once."""
        return self._drive(self._pool.gc())

    # -- seeing and steering ---------------------------------------------------

    def leases(self) -> tuple[LeaseInfo, ...]:
        """Every live lease: resource, token, owner, granted_at, expires_at
        (never the lease id). Writes nothing: a read-only user may call it."""
        return self._drive(self._pool.leases())

    def clients(self) -> tuple[ClientInfo, ...]:
        """Every client process of the pool (one per allocator object and
        process) that waits, holds a lease, or waited lately: its id, the
        host, pid and library version it gave when it joined, whether it is
        connected, how long it has been silent, its waiters and leases, and
        whether it is *stalled* (connected and waiting, but silent past its
        heartbeat: stopped, paused or blocked). Writes nothing: a read-only
        user may call it (docs/operations.md#clients)."""
        return self._drive(self._pool.clients())

    def stats(self) -> PoolStats:
        """The pool's counters since it was created (grants, timeouts,
        reclaimed, revoked, dropped waiters, the wait histogram), as the
        scripts keep them in Redis. Writes nothing."""
        return self._drive(self._pool.stats())

    def quarantine(self, resource: str, seconds: float) -> None:
        """Take ``resource`` out of rotation for ``seconds`` without holding a
        lease. Live leases on it stay valid; it gets no new grant until the
        time ends. Raises :class:`~allocator.UnknownResource` if it is not
        in the pool; a draining resource stays draining."""
        return self._drive(self._pool.quarantine(resource, seconds))

    def unquarantine(self, resource: str) -> bool:
        """End the quarantine of ``resource`` now (an operator's "it works
        again"): it is back in rotation at once and waiters are served.
        True if a quarantine ended, False if it was not quarantined (a rate
        throttle is the resource's own budget and stays; a draining resource
        stays draining). Raises :class:`~allocator.UnknownResource` if it is
        not in the pool."""
        return self._drive(self._pool.unquarantine(resource))

    def set_events(self, maxlen: int | None) -> None:
        """Switch the pool's event log on, keeping about the ``maxlen``
        latest events (1 to 10,000,000; older ones are trimmed), or off
        (None). The setting is kept with the pool, for every process that
        uses it: each grant, release, expiry, reclaim, revocation,
        quarantine and dropped waiter then adds an entry to the Redis
        Stream :attr:`events_key` (its resource, token, client id and time;
        never the lease id). Off by default; switched off, the entries
        already written stay until the pool is deleted. See the event log in
        docs/operations.md."""
        return self._drive(self._pool.set_events(maxlen))

    @property
    def events_key(self) -> str:
        """The name of the pool's event log, a Redis Stream (``XRANGE``,
        ``XREAD``; ``allocator events`` reads it): entries with fields
        ``kind``, ``resource``, ``token``, ``client`` (and ``owner`` for a
        grant or a drop), whose id is the server time in ms."""
        return self._pool.events_key

    def revoke(
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
        return self._drive(self._pool.revoke(resource, token, lease_id))

    def delete(self, *, force: bool = False) -> bool:
        """Remove the pool and every key it has; False if there was none.

        While leases are live or requesters wait, raises
        :class:`~allocator.AllocatorError` and changes nothing, unless
        ``force=True``: then holders get :class:`~allocator.LeaseLost` and
        waiters :class:`~allocator.AcquireTimeout`.
        """
        return self._drive(self._pool.delete(force))

    @staticmethod
    def pools(client: Any, *, prefix: str = "alloc") -> list[str]:
        """The names of the pools under ``prefix`` on this server (on a Redis
        Cluster: on every master), sorted. Writes nothing (SCAN)."""
        pattern = pools_pattern(prefix)
        if is_cluster(client):
            keys = client.scan_iter(match=pattern, count=1000, target_nodes=client.PRIMARIES)
            return pool_names(keys, prefix)
        # Each SCAN is a single call: its reply comes within the budget of one.
        found: list[Any] = []
        cursor = 0
        with no_client_retries():
            while True:
                scan = ("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                cursor, batch = execute(client, scan, time.monotonic() + RETRY_BUDGET)
                found.extend(batch)
                if not cursor:
                    return pool_names(found, prefix)


class _Keeper:
    """Renews a lease every ttl/3 from a daemon thread until stopped."""

    def __init__(self, owner: FairAllocator, lease: Lease) -> None:
        self._owner = owner
        self._lease = lease
        self._stopped = threading.Event()
        self._lost: LeaseLost | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"allocator-keepalive-{lease.resource}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._lease.ttl / 3):
            try:
                self._lease = self._owner.renew(self._lease)
            except LeaseLost as lost:
                self._lost = lost
                return
            except Exception:  # a transport error: try again next interval
                continue

    def stop(self) -> LeaseLost | None:
        """Stop renewing; returns the LeaseLost a renewal met, if any."""
        self._stopped.set()
        self._thread.join()
        return self._lost
