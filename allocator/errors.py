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
    """Base class of the library's own errors.

    Raised itself by `delete()` for a pool in use (nothing was deleted), and
    for what would be a bug: a script reply the Python side does not
    understand, or an argument the server refused (`ALLOCATOR-ARG`) that the
    library's own checks let through (the Lua scripts and the package out of
    step).
    """


class AcquireTimeout(AllocatorError, TimeoutError):
    """`acquire` (or `lease()`, `acquire_many`, `lease_many()`) waited
    `timeout` seconds without a grant, or its pool was deleted
    (`delete(force=True)`) while it waited. Also a `TimeoutError`.

    The requester has left the queue by the time this is raised; a grant that
    raced the timeout has been passed on to the next waiter. If the server
    was unreachable when the time ran out (the call's own retries, or its
    client's reads, were failing), the last transport error is the
    exception's `__cause__`: a blocking acquire with a `timeout` ends in
    `AcquireTimeout` at its deadline, whatever the reason, and the cause
    says why.

    Attributes:
        pool (str): The pool's name.
        waited (float): The seconds waited, the leaving of the queue included.
    """

    def __init__(self, pool: str, waited: float) -> None:
        super().__init__(f"no resource of pool {pool!r} was granted within {waited:.3f}s")
        self.pool = pool
        self.waited = waited


class LeaseLost(AllocatorError):
    """The lease is no longer held: it expired (and was reclaimed), it was
    revoked (`revoke()`, `remove(force=True)`, `delete(force=True)`), it was
    released before (or its release is still being delivered), this process
    gave it up (`reclaim_on_disconnect`), or the server lost it. The message
    says which, where that is known. Stop using the resource; its fencing
    token guards what is still in flight.

    Attributes:
        pool (str): The pool's name.
        resource (str): The leased resource.
        token (int): The lease's fencing token.
    """

    def __init__(self, pool: str, resource: str, token: int, reason: str = "") -> None:
        text = f"lease on {resource!r} (token {token}) of pool {pool!r} is no longer held"
        super().__init__(f"{text}: {reason}" if reason else text)
        self.pool = pool
        self.resource = resource
        self.token = token


class UnknownResource(AllocatorError, KeyError):
    """`bind`, `quarantine` or `unquarantine` named a resource that is not
    in the pool. Also a `KeyError`.

    Attributes:
        pool (str): The pool's name.
        resource (str): The resource named.
    """

    def __init__(self, pool: str, resource: str) -> None:
        super().__init__(resource)
        self.pool = pool
        self.resource = resource

    def __str__(self) -> str:
        return f"resource {self.resource!r} is not in pool {self.pool!r}"


class SeveralLeases(AllocatorError, ValueError):
    """`revoke(resource)` without a token, and the resource holds several
    live leases: nothing was revoked. Also a `ValueError`.

    Attributes:
        pool (str): The pool's name.
        resource (str): The resource named.
        tokens (tuple[int, ...]): The fencing tokens of its live leases,
            from the oldest grant; pass one as `token=` to pick the lease.
    """

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
    """Fewer than `min_replicas` replicas confirmed a grant or a renewal
    within `replica_timeout` (Redis `WAIT`).

    From `acquire` (or `acquire_many`): the grant has been released before
    this is raised, so nothing leaks; try again later. From `renew`: the
    lease stays as the primary has it (renewed there), but a failover now
    could lose the renewal.

    Attributes:
        pool (str): The pool's name.
        resource (str): The resource of the grant or the renewal.
        token (int): Its fencing token.
        replicas (int): How many replicas confirmed.
        wanted (int): How many were asked for (`min_replicas`).
        operation (str): `"acquire"` or `"renew"`.
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
    `ALLOCATOR-CORRUPT` error: [key layout](reference/key-layout.md#trust)).
    Nothing was changed by the call; `gc()` repairs what it can (the
    message says when it does).

    Attributes:
        pool (str): The pool's name.
        key (str): The damaged key.
        detail (str): What is wrong with it, and whether `gc()` mends it.
    """

    def __init__(self, pool: str, key: str, detail: str) -> None:
        super().__init__(f"pool {pool!r}: {key}: {detail}")
        self.pool = pool
        self.key = key
        self.detail = detail
