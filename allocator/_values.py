"""Immutable values that cross the API: what a grant, a status and a gc run return."""

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
    """A granted lease on one resource.

    ``token`` is the fencing token: every grant of a resource carries a token
    strictly greater than all earlier grants of that resource. ``id`` is the
    secret that proves ownership to ``renew`` and ``release``; it is left out of
    ``repr`` so that leases can be logged. Times are the Redis server's clock,
    in seconds since the epoch.
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
    """One row of :class:`PoolStatus`.

    ``state`` is one of ``"free"`` (in rotation, at least one slot free),
    ``"leased"`` (every slot taken), ``"quarantined"`` (out of rotation until
    ``until``; ``throttled`` tells that its rate budget put it there) or
    ``"draining"`` (removed, leaves when its last lease ends).
    """

    name: str
    capacity: int
    priority: float
    leases: int
    state: str
    until: float | None = None
    throttled: bool = False
    rate: tuple[int, float] | None = None
    #: Its live leases whose holder is not connected (presence: gone, or
    #: reconnecting; docs/concepts.md#presence-as-a-session).
    absent_holders: int = 0


@attrs.frozen
class PoolStatus:
    """A consistent snapshot of a pool, read in one script run."""

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
    #: Seconds the head of the queue has waited (0.0 with nobody waiting).
    oldest_wait: float = 0.0
    #: False when no key of the pool exists on the server (it reads as empty).
    exists: bool = True
    #: Live leases whose holder is not connected (the sum over resources).
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
    """One live lease, as ``leases()`` shows it to people: never its id (the
    secret that gives power over it). Times are the server's, in seconds."""

    resource: str
    token: int
    owner: str
    granted_at: float
    expires_at: float
    #: Whether the holder's process is connected (its presence:
    #: docs/concepts.md#presence-as-a-session); None where nobody can tell
    #: (a holder without a presence: an asyncio cluster or fakeredis client,
    #: an ACL without the channel).
    holder_present: bool | None = None
    #: The holder's client id (a process, as ``clients()`` shows it).
    client: str = ""
    #: The tenant the lease was acquired for (``""``: none named).
    tenant: str = ""


@attrs.frozen
class ClientInfo:
    """One client of a pool (an allocator object's connection in one
    process), as ``clients()`` shows it to people. ``host``, ``pid`` and
    ``version`` are what it said when it joined the pool (None once gc
    removed them with its liveness mark, docs/operations.md#clients).
    ``present``: connected (its presence), None where nobody can tell.
    ``silent_for``: seconds since its last heartbeat (a waiting client's
    reader beats every second), None if unknown (it never waited).
    ``stalled``: connected, waiting, and silent for longer than a
    heartbeat and a margin: the process is stopped or its loop blocked."""

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
    """A pool's counters since it was created, kept in Redis by the scripts
    (every process sees the same figures). All counts only grow.

    ``timeouts``: acquires that gave up (timeout, cancellation, interrupt);
    ``reclaimed``: leases that ended by expiry; ``revoked``: leases ended by
    ``remove(force=True)``; ``dropped_waiters``: queue entries of requesters
    that were gone. ``wait_seconds``: a cumulative histogram of the time from
    entering the queue to the grant, ``(upper_bound_seconds, count)`` pairs
    ending with ``inf`` (whose count equals ``grants``), and
    ``wait_seconds_sum`` the sum of those waits. ``quarantined_on_release``:
    quarantines started by ``release(lease, quarantine=...)``;
    ``quarantined_by_operator``: those started by ``quarantine(resource, s)``.
    """

    name: str
    grants: int = 0
    timeouts: int = 0
    reclaimed: int = 0
    revoked: int = 0
    dropped_waiters: int = 0
    #: Quarantines started by a release with quarantine=
    quarantined_on_release: int = 0
    #: Quarantines started by an operator's quarantine()
    quarantined_by_operator: int = 0
    wait_seconds: tuple[tuple[float, int], ...] = ()
    wait_seconds_sum: float = 0.0
    server_time: float = 0.0


@attrs.frozen
class GCReport:
    """What one ``gc()`` call did."""

    reclaimed: int = 0
    dropped_waiters: int = 0
    expired_bindings: int = 0
    unparked: int = 0
    orphans: int = 0
    #: Resources whose lease count disagreed with their live leases, set right.
    repaired: int = 0
    #: Seconds this call waited for the graces of absent waiters that it
    #: found (their processes gone, their presence not yet past its grace)
    #: to end, so that it could drop them too: one call leaves no dead
    #: waiter behind (docs/concepts.md, "Presence as a session").
    waited: float = 0.0
