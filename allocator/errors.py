"""The library's own exceptions.

Every error raised by ``allocator`` itself derives from :class:`AllocatorError`,
and each mixes in the builtin that a caller may already catch: an
:class:`AcquireTimeout` is a :class:`TimeoutError`, an :class:`UnknownResource`
is a :class:`KeyError`. Bad arguments raise plain :class:`ValueError` or
:class:`TypeError` before any I/O. Connection errors from redis-py pass through
unwrapped, after the library's own bounded retries.
"""

from __future__ import annotations

__all__ = ["AcquireTimeout", "AllocatorError", "LeaseLost", "UnknownResource"]


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
