"""What the shells need to know about a redis-py client, without I/O.

- :func:`client_kind`: is it a blocking or an asyncio client? Checked when
  an allocator is made, so that a client of the wrong kind fails at once
  with a clear ``TypeError`` instead of at the first reply.
- :func:`is_sentinel`: is it Sentinel-managed? Its single calls then retry
  long enough to ride out a failover (``FAILOVER_BUDGET``).
- :func:`pooled`: may the shells take its connections from its pool
  themselves, to bound a command's reads by the call's deadline?
- :func:`bound_client_retries` and :func:`no_client_retries`: redis-py
  (>= 6) gives each client a ``Retry`` of its own (by default 10 retries
  with backoff, run around every command *and* around every connect). Under
  the library's own retries they stack: with Redis unreachable a call took
  many seconds past its caller's timeout. The library runs its own
  commands with the client's retries switched off (one try, so that the
  core's retry policy alone decides, within the caller's deadline); the
  user's own commands on the same client keep the client's retries as
  configured.

How: the client's ``Retry`` objects (the one new connections copy, those of
the connections the pool already has, and a cluster's own) are given a
subclass of their class that adds nothing but a check of a context
variable: while the library runs a command, it makes one try; at any other
time it does exactly what the original class does, since it *is* that class
with the same state. A ``Retry`` of a class of the user's own is left alone
(the library's calls then carry its retries, as before).
"""

from __future__ import annotations

import collections
import contextvars
import inspect
from collections.abc import Iterator
from typing import Any

from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.client import Pipeline as SyncPipeline
from redis.cluster import ClusterPipeline as SyncClusterPipeline
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel as SyncSentinel
from redis.sentinel import SentinelConnectionPool

from ._core.presence import HEARTBEAT_PRESENT

__all__ = [
    "bound_client_retries",
    "client_kind",
    "heartbeat_for",
    "in_process",
    "is_cluster",
    "is_sentinel",
    "keeps_presence",
    "no_client_retries",
    "pooled",
    "reader_heartbeat",
]

_ONE_TRY: contextvars.ContextVar[bool] = contextvars.ContextVar("allocator_one_try", default=False)


def client_kind(client: object) -> str:
    """``"sync"`` or ``"async"``: how ``client`` runs a command.

    An asyncio client (``redis.asyncio.Redis``, ``redis.asyncio.cluster.
    RedisCluster``, fakeredis ``FakeAsyncRedis``, or any client whose
    ``execute_command`` is a coroutine function) is ``"async"``; a client
    with a plain ``execute_command`` is ``"sync"``. Anything else is no
    client to run the pool's calls on: ``TypeError``, saying what to pass.
    Three of those have an ``execute_command`` of their own: a client's
    class (``redis.Redis`` rather than ``redis.Redis(...)``), a pipeline
    (it buffers every command until ``execute()``: a call would wait for
    ever while the buffer grew) and a Sentinel manager (it talks to the
    Sentinels, not to the master).
    """
    if isinstance(client, type):
        raise TypeError(
            f"client must be a Redis client, not the class {client.__module__}."
            f"{client.__qualname__}: pass an instance of it, "
            f"{client.__qualname__}(...) or {client.__qualname__}.from_url(url)"
        )
    if isinstance(client, _PIPELINES):
        raise TypeError(
            f"client must be a Redis client, not a pipeline ({type(client).__module__}."
            f"{type(client).__qualname__}): a pipeline holds every command until "
            "execute(), so a call on it would never get its reply; pass the client "
            "the pipeline was made from"
        )
    if isinstance(client, _SENTINELS):
        raise TypeError(
            "client must be a Redis client, not a Sentinel manager "
            f"({type(client).__module__}.{type(client).__qualname__}), which talks to the "
            "Sentinels: pass the master's client, Sentinel(...).master_for('service-name')"
        )
    execute = getattr(client, "execute_command", None)
    if execute is None or not callable(execute):
        raise TypeError(
            "client must be a redis-py client (redis.Redis, redis.cluster.RedisCluster or "
            f"their asyncio twins), not {type(client).__name__}"
        )
    function = getattr(execute, "__func__", execute)
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(execute):
        return "async"
    if type(client).__module__.startswith("redis.asyncio"):
        return "async"
    return "sync"


#: What ``client_kind`` refuses for all their ``execute_command``.
_PIPELINES = (SyncPipeline, AsyncPipeline, SyncClusterPipeline, AsyncClusterPipeline)
_SENTINELS = (SyncSentinel, AsyncSentinel)


def _failed(error: Exception, fail: Any, args: Any, kwargs: Any) -> Any:
    """Call the caller's failure callback (it disconnects the connection) the
    way ``Retry.call_with_retry`` would on the first failure; None if the
    caller's ``is_retryable`` says the error is not for retrying."""
    is_retryable = kwargs.get("is_retryable", args[0] if args else None)
    if is_retryable is not None and not is_retryable(error):
        return None
    if kwargs.get("with_failure_count", args[1] if len(args) > 1 else False):
        return fail(error, 1)
    return fail(error)


class _BoundedSyncRetry(SyncRetry):
    """A redis-py ``Retry`` that makes one try while the library runs a command."""

    __slots__ = ()  # the same layout as Retry's (redis-py 5 gives it slots)

    def get_retries(self) -> int:
        return 0 if _ONE_TRY.get() else super().get_retries()

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ONE_TRY.get():
            return super().call_with_retry(do, fail, *args, **kwargs)
        try:
            return do()
        except self._supported_errors as error:
            _failed(error, fail, args, kwargs)
            raise


class _BoundedAsyncRetry(AsyncRetry):
    """Same as :class:`_BoundedSyncRetry`, for redis-py's asyncio ``Retry``."""

    __slots__ = ()

    def get_retries(self) -> int:
        return 0 if _ONE_TRY.get() else super().get_retries()

    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ONE_TRY.get():
            return await super().call_with_retry(do, fail, *args, **kwargs)
        try:
            return await do()
        except self._supported_errors as error:
            outcome = _failed(error, fail, args, kwargs)
            if inspect.isawaitable(outcome):
                await outcome
            raise


_BOUNDED: dict[type[Any], type[Any]] = {
    SyncRetry: _BoundedSyncRetry,
    AsyncRetry: _BoundedAsyncRetry,
}


def _bound(retry: Any) -> None:
    bounded = _BOUNDED.get(type(retry))
    if bounded is not None:
        retry.__class__ = bounded


def _holders(client: Any) -> Iterator[Any]:
    """What holds connections of a client: its pool, or a cluster's nodes
    (a sync cluster node has a client with a pool; an asyncio one keeps its
    connections itself)."""
    yield client
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        yield pool
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        yield manager
    for node in list((getattr(manager, "nodes_cache", None) or {}).values()):
        yield node
        node_pool = getattr(getattr(node, "redis_connection", None), "connection_pool", None)
        if node_pool is not None:
            yield node_pool


def bound_client_retries(client: Any) -> None:
    """Make the library's commands on ``client`` run without the client's
    own retries (see the module's docstring); no I/O, and no change to how
    the user's own commands on ``client`` are retried."""
    for holder in _holders(client):
        _bound(getattr(holder, "retry", None))  # a cluster's own
        kwargs = getattr(holder, "connection_kwargs", None)
        if isinstance(kwargs, dict):
            _bound(kwargs.get("retry"))
        for name in ("_available_connections", "_in_use_connections", "_connections", "_free"):
            conns = getattr(holder, name, None)
            if isinstance(conns, (list, set, tuple, collections.deque)):
                for conn in list(conns):
                    _bound(getattr(conn, "retry", None))


class no_client_retries:  # a class used as a function: `with no_client_retries():`
    """Within this block (this thread, or this asyncio task), commands on a
    client passed through :func:`bound_client_retries` make one try.

    A class rather than a ``contextlib.contextmanager``: it runs around
    every command of the library, and a generator-based one costs about a
    microsecond more each time."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _ONE_TRY.set(True)

    def __exit__(self, *exc: object) -> None:
        _ONE_TRY.reset(self._token)


def heartbeat_for(client: Any) -> float:
    """The longest blocking read that stays under the client's socket timeout."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:  # RedisCluster keeps them on its nodes manager
        kwargs = getattr(getattr(client, "nodes_manager", None), "connection_kwargs", None) or {}
    socket_timeout = kwargs.get("socket_timeout")
    if isinstance(socket_timeout, (int, float)) and socket_timeout > 0:
        return max(0.01, min(HEARTBEAT_PRESENT, socket_timeout / 2))
    return HEARTBEAT_PRESENT


def reader_heartbeat(client: Any) -> float:
    """How often a client's reader beats at the longest: the heartbeat of a
    client that keeps a presence, or on a cluster, whose blocking reads
    redis-py bounds by the client's socket timeout, :func:`heartbeat_for`
    (the reader of any other client waits for its reply itself)."""
    return heartbeat_for(client) if is_cluster(client) else HEARTBEAT_PRESENT


def in_process(client: Any) -> bool:
    """Whether ``client`` is fakeredis, the in-process backend."""
    return type(client).__module__.startswith("fakeredis")


def keeps_presence(client: Any) -> bool:
    """Whether the allocator keeps a presence (docs/concepts.md,
    "Presence") for this client: a server's connection to a real process (on
    a cluster, to the master of each slot it waits in). Not for fakeredis
    (one process, nothing to tell apart): there the liveness mark alone
    judges."""
    return not in_process(client)


def is_cluster(client: Any) -> bool:
    """A Redis Cluster client (sync or asyncio)?"""
    return hasattr(client, "nodes_manager")


def is_sentinel(client: Any) -> bool:
    """A Sentinel-managed client (``Sentinel(...).master_for(...)``, sync or
    asyncio): its connections find the master through the Sentinels."""
    pool = getattr(client, "connection_pool", None)
    return isinstance(pool, (SentinelConnectionPool, AsyncSentinelPool))


def pooled(client: Any) -> bool:
    """Whether the shells may run a command on a connection they take from
    ``client``'s pool themselves (to set its timeout): a ``redis.Redis`` or
    its asyncio twin, Sentinel-managed ones included. Not a cluster client
    (redis-py picks the node and follows redirections inside) nor a
    single-connection one (it has no pool to take from)."""
    return (
        not is_cluster(client)
        and getattr(client, "connection", None) is None
        and hasattr(client, "connection_pool")
    )
