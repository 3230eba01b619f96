"""The library's own exceptions.

Every error raised by ``allocator`` itself derives from :class:`AllocatorError`,
and each mixes in the builtin that a caller may already catch: an
:class:`AcquireTimeout` is a :class:`TimeoutError`, an :class:`UnknownResource`
is a :class:`KeyError`. Bad arguments raise plain :class:`ValueError` or
:class:`TypeError` before any I/O. Connection errors from redis-py pass through
unwrapped, after the library's own bounded retries.
"""

from __future__ import annotations

__all__ = [
    "AcquireTimeout",
    "AllocatorError",
    "CorruptPool",
    "LeaseLost",
    "NotReplicated",
    "SeveralLeases",
    "UnknownResource",
]


class AllocatorError(Exception):
    """Base class of the library's own errors."""


class AcquireTimeout(AllocatorError, TimeoutError):
    """``acquire`` (or ``lease()``) waited ``timeout`` seconds without a grant.

    The requester has left the queue by the time this is raised; a grant that
    raced the timeout has been passed on to the next waiter.
    """

    def __init__(self, pool: str, waited: float) -> None:
        super().__init__(f"no resource of pool {pool!r} was granted within {waited:.3f}s")
        self.pool = pool
        self.waited = waited


class LeaseLost(AllocatorError):
    """The lease is no longer held: it expired and was reclaimed, it was revoked
    by ``remove(force=True)``, or it was released before."""

    def __init__(self, pool: str, resource: str, token: int, reason: str = "") -> None:
        text = f"lease on {resource!r} (token {token}) of pool {pool!r} is no longer held"
        super().__init__(f"{text}: {reason}" if reason else text)
        self.pool = pool
        self.resource = resource
        self.token = token


class UnknownResource(AllocatorError, KeyError):
    """The named resource is not in the pool."""

    def __init__(self, pool: str, resource: str) -> None:
        super().__init__(resource)
        self.pool = pool
        self.resource = resource

    def __str__(self) -> str:
        return f"resource {self.resource!r} is not in pool {self.pool!r}"


class SeveralLeases(AllocatorError, ValueError):
    """``revoke(resource)`` without a token, and the resource holds several
    live leases: nothing was revoked. ``tokens`` are their fencing tokens,
    from the oldest grant; pass one as ``token=`` to pick the lease."""

    def __init__(self, pool: str, resource: str, tokens: tuple[int, ...]) -> None:
        shown = ", ".join(str(token) for token in tokens)
        super().__init__(
            f"resource {resource!r} of pool {pool!r} holds {len(tokens)} live leases "
            f"(tokens {shown}): give the token of the one to revoke; nothing was revoked"
        )
        self.pool = pool
        self.resource = resource
        self.tokens = tokens


class NotReplicated(AllocatorError):
    """Fewer than ``min_replicas`` replicas confirmed a grant or a renewal
    within ``replica_timeout`` (Redis ``WAIT``).

    From ``acquire``: the grant has been released before this is raised, so
    nothing leaks; try again later. From ``renew``: the lease stays as the
    primary has it (renewed there), but a failover now could lose the
    renewal. ``replicas`` is how many confirmed, ``wanted`` how many were
    asked for, ``operation`` ``"acquire"`` or ``"renew"``.
    """

    def __init__(
        self, pool: str, resource: str, token: int, replicas: int, wanted: int, operation: str
    ) -> None:
        super().__init__(
            f"{operation} of {resource!r} (token {token}) in pool {pool!r} was confirmed by "
            f"{replicas} of the {wanted} replicas asked for"
            + ("; the grant was released" if operation == "acquire" else "")
        )
        self.pool = pool
        self.resource = resource
        self.token = token
        self.replicas = replicas
        self.wanted = wanted
        self.operation = operation


class CorruptPool(AllocatorError):
    """A record of the pool is damaged (written by hand or by a bug: no
    script writes one) and the server refused to go on with it (its
    ``ALLOCATOR-CORRUPT`` error, lua/README.md "Trust"). ``key`` is the
    damaged key, ``detail`` what is wrong; ``gc()`` repairs what it can
    (the message says when it does). Nothing was changed by the call."""

    def __init__(self, pool: str, key: str, detail: str) -> None:
        super().__init__(f"pool {pool!r}: {key}: {detail}")
        self.pool = pool
        self.key = key
        self.detail = detail
