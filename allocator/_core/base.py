"""A pool's identity and settings (its name, the names of its keys, its
budgets), and the reading of its leases from what the server says of them
(script replies, grant messages)."""

from __future__ import annotations

from typing import Any, Self

import attrs
from redis.crc import key_slot

from .._values import Lease
from .checks import (
    MAX_LEASE_ID,
    MAX_NAME,
    MAX_REPLICAS,
    MAX_RESOURCE,
    MAX_TOKEN,
    _int,
    _ms,
    _seconds,
    _tenant,
    _text,
)
from .keys import KEY_SUFFIXES, _escape
from .messages import Grant, for_waiter, grant_of, many_id
from .replicas import Confirmation
from .replies import _BUSY, _GONE, State, _decode, _tagged, _unexpected
from .retry import FAILOVER_BUDGET, RETRY_BUDGET
from .steps import Call


@attrs.define(eq=False)
class PoolBase(Confirmation):
    """A pool's identity and settings, and the reading of its leases. Its
    single calls' retries (:class:`~.retry.SingleCalls`) and the
    confirmation of its writes on replicas (:class:`~.replicas.Confirmation`)
    come with it; :class:`~.pool.Pool` adds the operations (:mod:`.leasing`,
    :mod:`.admin`)."""

    name: str
    prefix: str
    lease_ttl: float
    bind_ttl: float
    keys: tuple[str, ...]
    #: Replicas that must confirm a grant or a renewal (0: none, no WAIT).
    min_replicas: int = 0
    #: How long a WAIT for them may block, in seconds.
    replica_timeout: float = 0.5
    #: How long a single call (release, renew, status, ...) keeps retrying,
    #: and the longest one try of any call may wait for its replies (None:
    #: up to the call's deadline). A Sentinel-managed client gets a budget
    #: that outlasts a failover, in tries no longer than a plain call, so
    #: that a try stuck on a hung master gives way to one on the new master.
    call_budget: float = RETRY_BUDGET
    try_budget: float | None = None
    #: Leases end once their holder's presence is gone for the grace
    #: (docs/concepts.md#dead-holders-reclaim_on_disconnect; off by
    #: default): the acquires say so to the scripts.
    reclaim_on_disconnect: bool = False
    #: The tenant of this allocator's requests that name none
    #: (docs/concepts.md#tenants; ``""``: no tenant).
    tenant: str = ""
    #: Whether the server's eviction policy was checked (Admin._check_policy).
    _policy_checked: bool = attrs.field(default=False, repr=False)
    #: The client ids that said who they are in this pool (their first
    #: acquire here: allocator/_core/clients.py).
    _introduced: set[str] = attrs.field(factory=set, repr=False)

    @classmethod
    def create(
        cls,
        name: object,
        *,
        lease_ttl: object,
        bind_ttl: object,
        prefix: object,
        min_replicas: object = 0,
        replica_timeout: object = 0.5,
        sentinel: bool = False,
        reclaim_on_disconnect: object = False,
        tenant: object = "",
    ) -> Self:
        """``sentinel``: the client is Sentinel-managed (the shell tells)."""
        name = _text("name", name, MAX_NAME)
        if not isinstance(reclaim_on_disconnect, bool):
            raise TypeError(
                f"reclaim_on_disconnect must be a bool, not {type(reclaim_on_disconnect).__name__}"
            )
        prefix = _text("prefix", prefix, MAX_NAME)
        base = f"{_escape(prefix)}:{{{_escape(name)}}}"
        keys = (*tuple(f"{base}:{suffix}" for suffix in KEY_SUFFIXES), f"{base}:s:")
        return cls(
            name=name,
            prefix=prefix,
            lease_ttl=_seconds("lease_ttl", lease_ttl),
            bind_ttl=_seconds("bind_ttl", bind_ttl),
            keys=keys,
            min_replicas=_int("min_replicas", min_replicas, 0, MAX_REPLICAS),
            replica_timeout=_seconds("replica_timeout", replica_timeout),
            call_budget=FAILOVER_BUDGET if sentinel else RETRY_BUDGET,
            try_budget=RETRY_BUDGET if sentinel else None,
            reclaim_on_disconnect=reclaim_on_disconnect,
            tenant=_tenant(tenant),
        )

    # -- identity -----------------------------------------------------------

    @property
    def slot(self) -> int:
        """The Redis Cluster hash slot of every key of the pool."""
        return int(key_slot(self.keys[0].encode("utf-8")))

    def signal_key(self, suffix: str) -> str:
        return self.keys[-1] + suffix

    # -- leases ---------------------------------------------------------------

    def _lease(self, lid: str, fields: list[Any]) -> Lease:
        ticket, token, granted_us, deadline_ms, ttl_ms, resource = fields
        return Lease(
            resource=_decode(resource),
            token=int(token),
            id=lid,
            ticket=_decode(ticket),
            expires_at=int(deadline_ms) / 1000,
            ttl=int(ttl_ms) / 1000,
            granted_at=int(granted_us) / 1e6,
            pool=self.name,
        )

    def _state(self, op: str, lid: str, reply: Any) -> State:
        tag, rest = _tagged(op, reply)
        if tag == "granted" and len(rest) == 6:
            return self._lease(lid, rest)
        if tag == "queued" and len(rest) == 2:
            hint = int(rest[1])
            return (_decode(rest[0]), None if hint < 0 else hint / 1000)
        if tag in (_GONE, _BUSY) and not rest:
            return tag
        if tag == "granted_many" and rest and len(rest) % 6 == 0:
            return [
                self._lease(many_id(lid, i // 6), rest[i : i + 6]) for i in range(0, len(rest), 6)
            ]
        if tag == "toomany" and len(rest) == 1:
            raise ValueError(
                f"count is larger than pool {self.name!r}: it has {int(rest[0])} resources"
            )
        raise _unexpected(op, reply)

    def _message(
        self, message: Any, lid: str, ticket: str, count: int | None = None
    ) -> Lease | float | str | None:
        """What a message from the signal list means to waiter ``lid``
        (:func:`~.messages.for_waiter`), its grant made a :class:`Lease`."""
        seen = for_waiter(message, lid, ticket, count)
        if isinstance(seen, Grant):
            deadline_ms = int(seen.granted_us) // 1000 + int(seen.ttl_ms)
            return self._lease(
                seen.lease_id,
                [seen.ticket, seen.token, seen.granted_us, deadline_ms, seen.ttl_ms, seen.resource],
            )
        return seen

    def _check_lease(self, lease: object) -> Lease:
        """A lease's fields are the caller's to change (``attrs.evolve``, a
        pickle from elsewhere): check every one the library reads back."""
        if not isinstance(lease, Lease):
            raise TypeError(f"lease must be a Lease, not {type(lease).__name__}")
        _text("lease.pool", lease.pool, MAX_NAME)
        if lease.pool != self.name:
            raise ValueError(f"lease belongs to pool {lease.pool!r}, not {self.name!r}")
        _text("lease.id", lease.id, MAX_LEASE_ID)
        _text("lease.resource", lease.resource, MAX_RESOURCE)
        ticket = _text("lease.ticket", lease.ticket, 64)
        first, dash, second = ticket.partition("-")
        if not (dash and first.isdigit() and second.isdigit() and first.isascii()):
            raise ValueError(f"lease.ticket must be a stream id like '1700000000000-0': {ticket!r}")
        _int("lease.token", lease.token, 0, MAX_TOKEN)
        _seconds("lease.ttl", lease.ttl)
        return lease

    def _ttl_ms(self, ttl: object) -> int:
        return _ms(self.lease_ttl if ttl is None else _seconds("ttl", ttl))

    def release_message(self, message: Any) -> Call[Any] | None:
        """For a grant that reached a client whose waiter had already left:
        the release that passes it on (None if ``message`` is no grant). Only
        if nobody claimed it: the waiter may have been handed it in a poll
        reply while the reader held the message."""
        grant = grant_of(message)
        if grant is None:
            return None
        return Call(
            "release", self.keys, (grant.lease_id, grant.ticket, "", "1"), lambda reply: reply
        )
