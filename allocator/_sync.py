# generated from allocator/_async.py by docs/scripts/async_to_sync.py: do not edit
"""`FairAllocator`: the blocking shell around the core.

Waiters of one Redis client in one process (per event loop for asyncio)
share one signal list per pool and one reader (:class:`Reader`), which
routes each grant to its waiter: ten
thousand waiting threads use one connection for waiting, and one heartbeat
every two seconds keeps all of them alive in the queue.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Literal, TypeVar, overload

from ._acompat import check_client
from ._core.pool import Pool
from ._scripts import scripts
from ._sync_admin import Admin
from ._sync_io import senders_of
from ._sync_keepalive import Keeper
from ._sync_reader import readers_of
from ._transport import bound_client_retries, is_sentinel
from ._values import Lease
from .errors import LeaseLost

__all__ = ["FairAllocator"]

_log = logging.getLogger("allocator")

T = TypeVar("T")


class FairAllocator(Admin):
    """A pool of named resources shared through Redis, granted in strict
    first-come-first-served order.

    `client` is a `redis.Redis` or a `redis.cluster.RedisCluster` (or
    fakeredis's `FakeRedis`), with `decode_responses` on or off, over RESP2
    or RESP3. Anything else is a `TypeError` at construction that says what
    to pass instead: a client of the other kind (blocking or asyncio), a
    client's class (`redis.Redis` itself), a pipeline, a `Sentinel` manager.
    A Sentinel-managed client (`Sentinel(...).master_for(...)`) is a client
    like any other: after a failover it reconnects to the new master, and its
    calls without a deadline of their own keep retrying for up to 45 s, where
    a plain client's give up after 2 s (`release` and `renew`: 5 s), long
    enough to ride out a failover with Sentinel's default settings
    ([operations](operations.md#sentinel)).

    `name` names the pool and `prefix` is the first part of its keys' names
    (each 1 to 200 printable characters): two allocators with the same
    server, `prefix` and `name` are the same pool, and pools with different
    names or prefixes never interact. Construction does no I/O. One object
    may be shared by many threads (asyncio: by the tasks of its client's
    event loop); each call is independent, and two callers never share a
    lease.

    `lease_ttl` is the default life of a lease without renewal, in seconds;
    `bind_ttl` how long a soft binding lives after its last use.

    `tenant` (default `""`: none) is who this allocator's requests are for
    where a call names none: under the pool's order `"tenant"`
    ([`set_order`][]), resources are shared fairly between tenants rather
    than between requests ([tenants](concepts.md#tenants)).

    `min_replicas` (default 0: no wait): [`acquire`][], [`acquire_many`][]
    and [`renew`][] return only once that many replicas confirmed the write
    (Redis `WAIT`, sent in the same round trip as the script), within
    `replica_timeout` seconds. If too few confirm in time, an acquire
    releases its grant and raises [`NotReplicated`][]; a renew raises it, the
    lease staying as the primary has it (renewed there). `WAIT` holds the
    reply for up to `replica_timeout`: keep the client's `socket_timeout`, if
    any, above it. fakeredis has no `WAIT`: keep 0 with it
    ([operations](operations.md#replicas-min_replicas)).

    `reclaim_on_disconnect` (default False): a lease this allocator acquires
    ends once the server has found its holder's process gone (its
    [presence](operations.md#presence) connection dropped) for the grace,
    about 1.5 s after the holder's death, instead of at its deadline, and the
    resource goes to the next waiter then. In return this process gives such
    a lease up by itself once its own presence has stayed unconfirmed for
    0.75 s (a partition, a server that stops answering), a part of the grace,
    so always before the server may end it: [`lost`][] turns true,
    [`renew`][] and the exit of [`lease`][] raise [`LeaseLost`][], and
    [`release`][] returns False. Where the client keeps no presence
    (fakeredis, a user whose ACL lacks the channel) it has no effect. The
    trade-off is in [concepts](concepts.md#dead-holders-reclaim_on_disconnect).

    While callers wait in `acquire`, the client has one reader in this
    process (per Redis client object, shared by every allocator and pool that
    uses it; per event loop for asyncio; on a cluster, per hash slot): the
    first waiting caller carries out its rounds itself, on one connection
    blocked on the client's signal list, and hands each grant or hint to the
    waiter it names; the others hold no connection. A heartbeat every 2 s
    (every second for a client without a presence) keeps the client's
    waiters in the queue. Daemon threads (asyncio: tasks) do what no caller
    is there to do: `allocator-reader` sends what no waiter is left to
    acknowledge, `allocator-presence` watches the presence connection while
    the client waits or holds a lease, `allocator-ends` delivers the ends
    the server did not confirm, and a `keepalive` renews a lease
    ([concepts](concepts.md#the-reader); [`close`][] ends them).

    [`extend`][], [`remove`][], [`quarantine`][], [`set_events`][],
    [`status`][] and [`gc`][] check once per object whether the server's
    `maxmemory-policy` is `allkeys-*`, which can evict the pool's keys, and
    warn (`RuntimeWarning`) if so
    ([operations](operations.md#maxmemory-policy)).

    Every call keeps its deadline against a server that stops answering: a
    read from the socket waits no longer than what is left of the call's
    `timeout` or budget (on a `redis.cluster.RedisCluster` client, only the
    client's own `socket_timeout` bounds a read). Transient errors are
    retried within it; see [Errors](api.md#errors).
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
        tenant: str = "",
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
            tenant=tenant,
        )
        check_client(self, client)
        bound_client_retries(client)
        self._client = client
        self._scripts = scripts()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._pool.name!r}, prefix={self._pool.prefix!r})"

    @property
    def name(self) -> str:
        """The pool's name."""
        return self._pool.name

    def close(self) -> None:
        """End the background work of this allocator's client in this process, for
        a process that wants it gone before it exits.

        Unless other callers still wait on it, the client's reader ends: its own
        thread (asyncio: task), if it is finishing rounds that no waiter was left
        to carry, ends first, within about a heartbeat (2 s), and the reader's
        connection goes back to the client's pool once the replies still due on
        it (the last acknowledgements) are read. Its presence connection closes
        too, once nothing is held or waited on. Cancels and releases of the
        client that are still being delivered in the background
        ([concepts](concepts.md#ends-still-to-deliver)) get up to 2 s more to
        reach the server; what is still undelivered then is dropped (logged at
        warning): those leases end at their deadlines.

        Leases stay as they are (release them first; a `lease()` block's
        keepalive ends with its block), and the client stays open (it is yours
        to close). The allocator stays usable: a later wait starts again what it
        needs. The allocator is also a context manager that calls `close()` at
        its exit:

        ```python
        with FairAllocator(client, "proxies") as pool:
            ...
        ```
        """
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
        """The Redis client given."""
        return self._client

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
        tenant: str | None = ...,
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
        tenant: str | None = ...,
    ) -> Lease | None: ...

    def acquire(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        blocking: bool = True,
        owner: str | None = None,
        tenant: str | None = None,
    ) -> Lease | None:
        """Wait in line for a resource and lease it.

        Blocks until every requester that queued earlier has been served and a
        resource is free; on a pool with no resources, it waits like any other
        requester until [`extend`][] serves it.

        - `timeout`: seconds to wait; None (or `math.inf`): no limit. When it
          runs out, [`AcquireTimeout`][] is raised: the requester has left the
          queue, and a grant that raced the timeout has been passed on.
          `timeout=0` queues, takes a resource if one is granted at once, and
          otherwise leaves and raises.
        - `ttl`: the lease's life without renewal, in seconds (default: the
          pool's `lease_ttl`).
        - `bind`: a soft-binding name: the resource last used under that name if
          it is free, else any free resource
          ([concepts](concepts.md#soft-binding)).
        - `blocking=False`: a lease only if one can be granted at once without
          passing anyone already waiting, else None. It never queues.
        - `owner`: who holds the lease, for people reading [`leases`][] and
          `allocator status` (1 to 200 printable characters; default
          `"<hostname>:<pid>"`). It gives no power over the lease.
        - `tenant`: who the request is for (default: the allocator's `tenant`;
          `""` for none), at most 200 printable characters. Under the pool's
          order `"fifo"` (the default) it is only recorded and shown
          ([`leases`][], `status().tenants`); under `"tenant"`
          ([`set_order`][]) it decides the order of service: "every requester
          that queued earlier" above is then every earlier requester of the
          same tenant, and the tenants take turns by weight
          ([tenants](concepts.md#tenants)).

        Uncontended, this is one round trip to Redis; a waiter is woken by a push
        to its client's signal list, never by polling the pool. With
        `min_replicas`, a grant counts only once confirmed: else it is released
        and [`NotReplicated`][] raised.

        A transient error while queued or waiting (see [Errors](api.md#errors)) is
        retried until `timeout` (for ever with None), and the retried call keeps
        its place in the queue. When the time runs out while the server is
        unreachable or hung, the call leaves the queue (one try of at most
        0.15 s of its own) and raises `AcquireTimeout` saying the whole time
        waited, the last transport error as its `__cause__`. `blocking=False`
        retries within the single-call budget (2 s; 45 s on a Sentinel-managed
        client), then lets the error through.

        Giving up in any other way also leaves the queue, and passes on a grant
        that raced in, before the exception goes on: a KeyboardInterrupt, or any
        other exception raised into the waiting thread (a `signal.alarm` handler
        that raises, say), even while it leads its client's reads; for asyncio,
        the cancellation of the waiting task, even where redis-py's asyncio
        client swallows a cancellation that lands mid-command (a known
        behaviour of redis-py: the allocator checks `asyncio.Task.cancelling()`).
        A pool deleted with `delete(force=True)` while the call waits makes it
        raise `AcquireTimeout` at once.
        """
        reader = self._reader()
        flow = self._waiting(
            reader,
            lambda cid, t0: self._pool.acquire(
                timeout, ttl, bind, blocking, cid=cid, owner=owner, started=t0, tenant=tenant
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
        tenant: str | None = None,
    ) -> Iterator[Lease]:
        """Acquire on entry, release on exit: a context manager.

        ```python
        with pool.lease(timeout=10) as proxy:
            fetch(url, proxy=proxy.resource, fence=proxy.token)
        ```

        `timeout`, `ttl`, `bind`, `owner` and `tenant` mean what they mean for
        [`acquire`][].

        - If the lease was lost while the block ran (expired, revoked, given up
          by this process), the exit raises [`LeaseLost`][]. A lease whose
          deadline passed counts as lost even if nobody took the resource since.
        - If the block raised, its exception propagates unchanged: the lease is
          released, and a failure to release is not reported.
        - `keepalive=True` renews the lease every `ttl/3` seconds while the block
          runs, from a daemon thread (asyncio: a task). A renewal that finds the
          lease lost stops the renewing, and the exit raises `LeaseLost`; one
          that fails on a transport error is tried again at the next interval.
          The `Lease` the block holds keeps its first `expires_at`: renewals do
          not update it.
        """
        if not isinstance(keepalive, bool):
            raise TypeError(f"keepalive must be a bool, not {type(keepalive).__name__}")
        held = self.acquire(timeout, ttl=ttl, bind=bind, owner=owner, tenant=tenant)
        keeper = Keeper(self, held) if keepalive else None
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
        tenant: str | None = ...,
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
        tenant: str | None = ...,
    ) -> list[Lease] | None: ...

    def acquire_many(
        self,
        count: int,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        owner: str | None = None,
        tenant: str | None = None,
    ) -> list[Lease] | None:
        """Wait in line for `count` distinct resources and lease them all at once:
        all or nothing.

        Returns `count` leases, each with its own `id`, `ticket` and fencing
        token, in the order they were chosen (priority, then free for longest),
        all with the same `granted_at`. The request takes one place in the same
        queue as [`acquire`][]. At the head of the queue it is granted when
        `count` resources are free at once (quarantined, throttled and draining
        resources do not count; a resource with a capacity above 1 counts once);
        until then those behind it wait too, even if a resource is free for them,
        so that a stream of single requests never starves it
        ([concepts](concepts.md#several-resources-at-once)).

        - `count`: an int from 1 to 1000. A `count` larger than the pool
          (`status().size`, draining resources included) raises `ValueError`,
          and nothing is queued. If the pool shrinks below `count` while the
          request waits, it waits as on an empty pool, until [`extend`][] lets it
          be served, holding up those behind it meanwhile.
        - `timeout`, `ttl`, `blocking`, `owner` and `tenant` mean what they mean
          for `acquire` ([`leases`][] shows the owner and tenant of every
          lease). A timeout, an interrupt or a cancellation leaves the queue and
          ends any lease that raced in: nothing is left behind.
        - Under the order `"tenant"`, the request takes its tenant's turn once
          it is its tenant's first; chosen next, it is served before anyone of
          any tenant, as at the head of the queue
          ([tenants](concepts.md#tenants)).
        - Each lease is renewed and released on its own ([`renew`][],
          [`release`][]); a holder that dies loses all of them at their deadline
          (they have the same ttl).
        - With `min_replicas`, the call returns only once every lease is
          confirmed by that many replicas; otherwise every lease is released and
          [`NotReplicated`][] raised.
        """
        reader = self._reader()
        flow = self._waiting(
            reader,
            lambda cid, t0: self._pool.acquire_many(
                count, timeout, ttl, blocking, cid=cid, owner=owner, started=t0, tenant=tenant
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
        tenant: str | None = None,
    ) -> Iterator[list[Lease]]:
        """[`acquire_many`][] on entry, a [`release`][] of every lease on exit: a
        context manager.

        ```python
        with pool.lease_many(2, timeout=60) as (a, b):
            train(gpus=[a.resource, b.resource])
        ```

        `count`, `timeout`, `ttl`, `owner` and `tenant` mean what they mean for
        `acquire_many`. At the exit every lease is released, whatever happens to
        another; then, if a lease was lost while the block ran, the exit raises
        [`LeaseLost`][] for the first one lost, else the first error a release
        raised, if any. If the block raised, its exception propagates unchanged.
        `keepalive=True` renews every lease every `ttl/3`, each from a daemon
        thread (asyncio: a task) of its own.
        """
        if not isinstance(keepalive, bool):
            raise TypeError(f"keepalive must be a bool, not {type(keepalive).__name__}")
        held = self.acquire_many(count, timeout, ttl=ttl, owner=owner, tenant=tenant)
        keepers = [Keeper(self, lease) for lease in held] if keepalive else []
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
        """Push the lease's deadline to now + `ttl` on the server clock (default:
        the lease's own ttl).

        Returns the lease with its new `expires_at` (and `ttl`): use the
        returned value from then on. A lease past its deadline is never brought
        back, even if nobody reclaimed it yet. What the caller may conclude:

        - a [`Lease`][]: the lease is live until its new `expires_at` (server
          clock);
        - [`LeaseLost`][]: the lease has ended, or is ending: expired, revoked,
          released, or its release is still being delivered in the background
          (see [`release`][]); raised without asking the server once this process
          knows it lost the lease ([`lost`][]: the server said it ended, or this
          process gave it up under `reclaim_on_disconnect`). Stop using the
          resource;
        - a transport error (redis-py's `TimeoutError` or `ConnectionError`): the
          server did not answer in time, so nothing is known. `renew` rides out a
          pause or a stall of a few seconds: it retries for 5 s, or half the
          lease's ttl if less, never under 2 s (45 s on a Sentinel-managed
          client). The lease still ends at its old deadline unless a later renew
          gets through; a keepalive simply tries again at its next interval.

        With `min_replicas`, a renewal that too few replicas confirmed raises
        [`NotReplicated`][]: the lease stays as the primary has it (renewed
        there), but a failover now could lose the renewal.
        """
        reader = self._reader()
        renewed = self._drive(self._pool.renew(lease, ttl, reader.lost))
        reader.renewed(renewed)
        return renewed

    def lost(self, lease: Lease) -> bool:
        """Whether this process knows that `lease` ended, without asking the server
        (no I/O: not a coroutine, for asyncio either).

        It turns true within a few ms of a [`revoke`][], of the server
        reclaiming the lease (past its deadline, or its holder found gone under
        `reclaim_on_disconnect`), or of a `remove(force=True)` of its resource
        or a `delete(force=True)` of its pool: the script that ends the lease
        publishes its end on the holder's presence channel, which the holder's
        presence connection already listens to. It also turns true when this
        process gives up a `reclaim_on_disconnect` lease because its own
        presence stayed unconfirmed for 0.75 s, always before the server may end
        it and grant its resource again. From then on [`renew`][] raises
        [`LeaseLost`][] without asking the server (a keepalive stops), and so
        does the exit of the [`lease`][] block.

        A holder in the middle of long work checks it between steps, and sends
        its fencing token with every write, which the resource refuses once a
        newer token has been used:

        ```python
        with pool.lease(timeout=10, keepalive=True) as lease:
            for chunk in work:
                if pool.lost(lease):
                    break                       # the exit raises LeaseLost
                store.write(chunk, fence=lease.token)
        ```

        False proves nothing: the word of an end may not reach a process whose
        connection is down, or that is stopped (it is read when it resumes); the
        token is what keeps a late write out. Only for a client that keeps a
        presence ([operations](operations.md#presence)).
        """
        return self._reader().lost(lease)

    def release(self, lease: Lease, *, quarantine: float | None = None) -> bool:
        """End the lease and hand the resource to the next waiter, in one round
        trip.

        `quarantine` (seconds) keeps the resource out of rotation for that long;
        waiters are woken and served when it ends. It has no effect on a
        draining resource. Releasing a lease twice is harmless. What the caller
        may conclude:

        - True: the lease was live and is now released;
        - False: it had already ended (past its deadline, reclaimed, revoked, or
          released before: by an earlier call, by a retry whose first try got
          through, or by a release that was being delivered in the background),
          or this process knew it lost the lease ([`lost`][]), which is then
          released all the same;
        - a transport error (redis-py's `TimeoutError` or `ConnectionError`): the
          server did not answer for 5 s (45 s on a Sentinel-managed client), so
          the outcome is not known: the release may have been applied. It is not
          forgotten: the client keeps it and sends it again in the background as
          soon as the server answers, so that the resource comes back then, not
          at the lease's deadline
          ([concepts](concepts.md#ends-still-to-deliver)). Treat the lease as
          gone: a [`renew`][] of it raises [`LeaseLost`][], and calling `release`
          again is harmless. It is given up only at the lease's deadline, or when
          [`close`][] runs out of time.

        A pause of a few seconds (`CLIENT PAUSE`, a stall, a slow failover) is
        ridden out: the call returns when the server answers. Only the holder of
        a `Lease` can renew or release it: its `id` is the proof. A `Lease` can
        be pickled, so that another process of the same pool can release it.
        """
        reader = self._reader()
        released = self._drive(self._pool.release(lease, quarantine, reader.lost))
        reader.unhold(lease)
        return released
