"""Immutable values that cross the API: what a grant, a status and a gc run return.

Each class documents its fields in an ``Attributes:`` section, which the API
reference (docs/api.md) renders as a table with the fields' types."""

from __future__ import annotations

import attrs

__all__ = [
    "ClientInfo",
    "GCReport",
    "Lease",
    "LeaseInfo",
    "PoolStats",
    "PoolStatus",
    "ResourceStatus",
    "TenantStatus",
]


@attrs.frozen
class Lease:
    """A granted lease on one resource, as `acquire` returns it.

    Immutable (an `attrs` frozen class) and compared by value, as every
    value of the library. It can be pickled, so that another process of the
    same pool can renew or release it. Times are the Redis server's clock,
    in seconds since the epoch.

    Attributes:
        resource: The leased resource.
        token: The fencing token: strictly greater than the token of every
            earlier grant of this resource (a resource removed and added
            again continues its sequence).
        id: The lease id, unguessable: the secret that proves ownership to
            `renew` and `release`. Left out of `repr`, so that leases can
            be logged.
        ticket: The queue ticket, a Redis Stream entry id `"<ms>-<seq>"`;
            tickets sort in arrival order when compared as `(ms, seq)`.
        expires_at: The deadline, server time in seconds.
        ttl: The lease's ttl in seconds, what `renew` uses by default.
        granted_at: The grant time, server time in seconds (microsecond
            precision).
        pool: The pool's name.
    """

    resource: str
    token: int
    id: str = attrs.field(repr=False)
    ticket: str
    expires_at: float
    ttl: float
    granted_at: float
    pool: str


@attrs.frozen
class ResourceStatus:
    """One resource of a pool, a row of [`PoolStatus`][allocator.PoolStatus].

    Attributes:
        name: The resource.
        capacity: How many leases it may have at once.
        priority: Its priority (a higher one is granted first).
        leases: Its live leases.
        state: `"free"` (in rotation, at least one slot free), `"leased"`
            (every slot taken), `"quarantined"` (out of rotation until
            `until`; `throttled` tells whether its rate budget put it
            there) or `"draining"` (removed, leaves when its last lease
            ends).
        until: When a quarantine or a throttle ends, server time in
            seconds; None when neither runs.
        throttled: True if its rate budget, not a quarantine, put it out of
            rotation.
        rate: Its rate limit, `(count, seconds)`; None: no limit.
        absent_holders: Its live leases whose holder is not connected (its
            presence gone, or reconnecting:
            [concepts](concepts.md#presence-as-a-session)).
    """

    name: str
    capacity: int
    priority: float
    leases: int
    state: str
    until: float | None = None
    throttled: bool = False
    rate: tuple[int, float] | None = None
    absent_holders: int = 0


@attrs.frozen
class PoolStatus:
    """A snapshot of a pool, as `status()` reads it: a pool of up to 250
    resources in one script run, a larger one a page of 250 per run.

    Attributes:
        name: The pool's name.
        size: Resources in the pool, draining ones included.
        free: Resources in rotation with at least one free slot.
        leased: Live leases.
        waiting: Requesters queued (a request of `acquire_many` counts
            once).
        resources: One row per resource, sorted by name.
        bindings: Live soft bindings.
        bind_hits: Grants that got their bound resource.
        bind_misses: Grants with a binding name that did not get it (a
            first use included).
        server_time: The server's clock at the snapshot (its first page),
            in seconds.
        oldest_wait: Seconds the head of the queue has waited (0.0 with
            nobody waiting).
        exists: False when no key of the pool exists on the server (it then
            reads as empty).
        absent_holders: Live leases whose holder is not connected (the sum
            over the resources; see `LeaseInfo.holder_present`).
    """

    name: str
    size: int
    free: int
    leased: int
    waiting: int
    resources: tuple[ResourceStatus, ...]
    bindings: int = 0
    bind_hits: int = 0
    bind_misses: int = 0
    server_time: float = 0.0
    oldest_wait: float = 0.0
    exists: bool = True
    absent_holders: int = 0
    #: The pool's order (docs/concepts.md#tenants): ``"fifo"`` (arrival
    #: order), ``"tenant"`` (fair shares between tenants), or
    #: ``"building"`` while a switch to ``"tenant"`` indexes the waiters.
    order: str = "fifo"
    #: One row per tenant that waits, holds a lease, was granted or has a
    #: weight, by name (``""``: requests that name none); empty while no
    #: request of the pool named a tenant and the order is ``"fifo"``.
    tenants: tuple[TenantStatus, ...] = ()


@attrs.frozen
class TenantStatus:
    """One tenant of a pool (docs/concepts.md#tenants), a row of
    :attr:`PoolStatus.tenants`. ``grants`` counts since the pool was made
    (for ``""``, the pool's grants less those of named tenants).
    ``count`` is the service it has had under the order ``tenant``, in
    grants weighted by 1/``weight`` (a tenant that waits again is raised
    to the least count of those waiting); 0 if it never had any."""

    name: str
    waiting: int = 0
    leases: int = 0
    grants: int = 0
    weight: float = 1.0
    count: float = 0.0
    #: Seconds its first waiting request has waited (0.0 if none waits).
    oldest_wait: float = 0.0


@attrs.frozen
class LeaseInfo:
    """One live lease, as `leases()` shows it to people: never its id (the
    secret that gives power over it). Times are the server's, in seconds.

    Attributes:
        resource: The leased resource.
        token: Its fencing token.
        owner: Who holds it, as the acquire named it (`owner=`; by default
            `"<hostname>:<pid>"`).
        granted_at: The grant time.
        expires_at: The deadline.
        holder_present: Whether the holder's process is connected (its
            [presence](operations.md#presence)): False once it died, or
            while it reconnects; None where nobody can tell (a holder
            without a presence: a fakeredis client, a user whose ACL lacks
            the channel).
        client: The holder's client id, as `clients()` shows it.
    """

    resource: str
    token: int
    owner: str
    granted_at: float
    expires_at: float
    holder_present: bool | None = None
    client: str = ""
    #: The tenant the lease was acquired for (``""``: none named).
    tenant: str = ""


@attrs.frozen
class ClientInfo:
    """One client of a pool (a Redis client object in one process), as
    `clients()` shows it to people; sorted by host, pid and id.

    Attributes:
        id: The client's id in the pool (`p.` first where it keeps a
            presence).
        host: The host it said it runs on when it joined the pool (its
            first acquire there); None once gc removed what it said with
            its liveness mark.
        pid: Its process id, as it said when it joined; None likewise.
        version: Its version of the library, as it said when it joined;
            None likewise.
        joined_at: When it joined, server time in seconds; None likewise.
        present: Whether it is connected (its presence); None where nobody
            can tell.
        silent_for: Seconds since its last heartbeat (a waiting client
            beats every 2 s, every second without a presence); None if
            unknown (it never waited, or its mark is gone).
        waiters: Its requests waiting in the queue.
        leases: Its live leases.
        stalled: Connected and waiting, but silent for longer than its
            heartbeat and a margin of 1 s: the process is stopped, paused or
            its event loop blocked.
    """

    id: str
    host: str | None
    pid: int | None
    version: str | None
    joined_at: float | None
    present: bool | None
    silent_for: float | None
    waiters: int
    leases: int
    stalled: bool


@attrs.frozen
class PoolStats:
    """A pool's counters since it was created, as `stats()` reads them:
    kept in Redis by the scripts, so that every process sees the same
    figures. All counts only grow.

    Attributes:
        name: The pool's name.
        grants: Leases granted.
        timeouts: Acquires that gave up (a timeout, a cancellation, an
            interrupt) and left the queue.
        reclaimed: Leases that ended without their holder: past their
            deadline, or their holder found gone (`reclaim_on_disconnect`).
        revoked: Leases revoked by `revoke()` or `remove(force=True)`.
        dropped_waiters: Queue entries of requesters that were gone.
        quarantined_on_release: Quarantines started by
            `release(lease, quarantine=...)`.
        quarantined_by_operator: Quarantines started by
            `quarantine(resource, seconds)`.
        wait_seconds: A cumulative histogram of the time from entering the
            queue to the grant: `(upper_bound_seconds, count)` pairs, from
            5 ms to 300 s, ending with `(inf, grants)`.
        wait_seconds_sum: The sum of those waits, in seconds.
        server_time: The server's clock when read, in seconds.
    """

    name: str
    grants: int = 0
    timeouts: int = 0
    reclaimed: int = 0
    revoked: int = 0
    dropped_waiters: int = 0
    quarantined_on_release: int = 0
    quarantined_by_operator: int = 0
    wait_seconds: tuple[tuple[float, int], ...] = ()
    wait_seconds_sum: float = 0.0
    server_time: float = 0.0


@attrs.frozen
class GCReport:
    """What one `gc()` call did.

    Attributes:
        reclaimed: Leases ended because they were past their deadline (or
            void).
        dropped_waiters: Queue entries of waiters that were gone.
        expired_bindings: Soft bindings past their ttl.
        unparked: Quarantines and rate throttles that ended.
        orphans: Queue entries of leases (a granted ticket that an earlier
            version kept in the queue), cleaned up.
        repaired: Resources whose lease count disagreed with their live
            leases, set right.
        waited: Seconds this call waited for the graces of absent waiters
            that it found (their processes gone, their presence not yet
            past its grace) to end, so that it could drop them too: one
            call leaves no dead waiter behind
            ([concepts](concepts.md#presence-as-a-session)).
    """

    reclaimed: int = 0
    dropped_waiters: int = 0
    expired_bindings: int = 0
    unparked: int = 0
    orphans: int = 0
    repaired: int = 0
    waited: float = 0.0
