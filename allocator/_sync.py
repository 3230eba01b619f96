"""`FairAllocator`: the blocking shell around the core."""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Literal, TypeVar, overload

from redis.exceptions import NoScriptError

from . import _core
from ._core import Call, Command, Flow, Pool, Step, Wait
from ._scripts import scripts
from ._transport import bound_client_retries, client_kind, no_client_retries
from ._values import GCReport, Lease, PoolStatus
from .errors import LeaseLost

__all__ = ["FairAllocator"]

_log = logging.getLogger("allocator")

T = TypeVar("T")


def heartbeat_for(client: Any) -> float:
    """The longest blocking read that stays under the client's socket timeout."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:  # RedisCluster keeps them on its nodes manager
        kwargs = getattr(getattr(client, "nodes_manager", None), "connection_kwargs", None) or {}
    socket_timeout = kwargs.get("socket_timeout")
    if isinstance(socket_timeout, (int, float)) and socket_timeout > 0:
        return max(0.01, min(_core.HEARTBEAT, socket_timeout / 2))
    return _core.HEARTBEAT


class FairAllocator:
    """A pool of named resources shared through Redis, granted in strict
    first-come-first-served order.

    ``client`` is a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (or a
    fakeredis ``FakeRedis``), with ``decode_responses`` on or off, over RESP2
    or RESP3. Two allocators with the same server, ``prefix`` and ``name``
    are the same pool. Construction does no I/O.

    ``lease_ttl`` is the default life of a lease without renewal, in seconds;
    ``bind_ttl`` how long a soft binding lives after its last use.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        lease_ttl: float = 60.0,
        bind_ttl: float = 3600.0,
        prefix: str = "alloc",
    ) -> None:
        self._pool = Pool.create(name, lease_ttl=lease_ttl, bind_ttl=bind_ttl, prefix=prefix)
        if client_kind(client) != "sync":
            raise TypeError(
                f"client must be a blocking Redis client for {type(self).__name__}, "
                f"got the asyncio {type(client).__module__}.{type(client).__qualname__}: "
                "use AsyncFairAllocator with it"
            )
        bound_client_retries(client)
        self._client = client
        self._scripts = scripts()
        self._heartbeat = heartbeat_for(client)
        self._router: _Router | None = None
        self._router_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._pool.name!r}, prefix={self._pool.prefix!r})"

    @property
    def name(self) -> str:
        return self._pool.name

    @property
    def client(self) -> Any:
        return self._client

    # -- the driver: the only place that does I/O --------------------------

    def _drive(self, steps: Flow[T]) -> T:
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply, error = None, None
            try:
                reply = self._step(step)
            except BaseException as exc:  # handed to the flow, which decides
                error = exc

    def _step(self, step: Step) -> Any:
        if isinstance(step, Call):
            keys, args = step.keys, step.args
            with no_client_retries():
                try:
                    return self._client.evalsha(
                        self._scripts.sha[step.script], len(keys), *keys, *args
                    )
                except NoScriptError:
                    # Flushed, restarted, failed over: run it by its text,
                    # which caches it again. Unlike SCRIPT LOAD then EVALSHA,
                    # no flush can land in between.
                    text = self._scripts.text[step.script]
                    return self._client.eval(text, len(keys), *keys, *args)
        if isinstance(step, Wait):
            return self._get_router().wait(step.lid, step.timeout)
        if isinstance(step, Command):
            with no_client_retries():
                return self._client.execute_command(*step.args)
        time.sleep(step.seconds)
        return None

    def _get_router(self) -> _Router:
        with self._router_lock:
            if self._router is None or self._router.pid != os.getpid():
                self._router = _Router(self)
            return self._router

    # -- leasing --------------------------------------------------------------

    @overload
    def acquire(
        self,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        bind: str | None = ...,
        blocking: Literal[True] = ...,
    ) -> Lease: ...

    @overload
    def acquire(
        self,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        bind: str | None = ...,
        blocking: bool,
    ) -> Lease | None: ...

    def acquire(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        blocking: bool = True,
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
        push to its signal list, never by polling the pool.
        """
        flow = self._pool.acquire(timeout, ttl, bind, blocking)
        router = self._get_router()
        router.register(flow.lid)
        try:
            return self._drive(flow.steps)
        finally:
            router.unregister(flow.lid)

    @contextlib.contextmanager
    def lease(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        keepalive: bool = False,
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
        held = self.acquire(timeout, ttl=ttl, bind=bind)
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

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease:
        """Push the lease's deadline to now + ``ttl`` (default: the lease's
        own ttl) on the server clock. Returns the lease with its new
        ``expires_at``; raises :class:`~allocator.LeaseLost` if it is no
        longer held (a lease past its deadline is never brought back)."""
        return self._drive(self._pool.renew(lease, ttl))

    def release(self, lease: Lease, *, quarantine: float | None = None) -> bool:
        """End the lease and hand the resource to the next waiter.

        True if the lease was live and is now released; False if it had
        already ended (expired, revoked, or released before). ``quarantine``
        keeps the resource out of rotation for that many seconds; waiters
        are woken and served when it ends.
        """
        return self._drive(self._pool.release(lease, quarantine))

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


class _Router:
    """One blocking reader per allocator and process: a daemon thread.

    It pops the client's signal list and hands each message to the waiter it
    names, so waiting threads hold no connection (a bounded pool is not
    exhausted by many waiters) and wait on the client's clock. A grant for a
    waiter that already left is released, so that it passes on at once
    instead of after the pick-up window. Once a heartbeat interval it runs
    the client-level poll that keeps all local waiters alive; if the pool's
    epoch changed or the reader was silent past the liveness window, every
    waiter checks its ticket. The thread ends when no waiter is left.
    """

    def __init__(self, owner: FairAllocator) -> None:
        self.pid = os.getpid()
        self._owner = owner
        self._pool = owner._pool
        self._key = self._pool.signal_key(self._pool.client_id)
        self._lock = threading.Lock()
        self._queues: dict[str, queue.SimpleQueue[Any]] = {}
        self._reader: threading.Thread | None = None
        self._epoch: str | None = None
        # Waiters that have waited, probed in turn (O(1) add, remove, rotate).
        self._probes: collections.OrderedDict[str, None] = collections.OrderedDict()

    def register(self, lid: str) -> None:
        with self._lock:
            self._queues[lid] = queue.SimpleQueue()

    def unregister(self, lid: str) -> None:
        with self._lock:
            self._queues.pop(lid, None)
            self._probes.pop(lid, None)

    def _next_probe(self) -> str:
        with self._lock:
            if not self._probes:
                return ""
            lid = next(iter(self._probes))
            self._probes.move_to_end(lid)
            return lid

    def wait(self, lid: str, timeout: float | None) -> Any:
        with self._lock:
            inbox = self._queues[lid]
            self._probes[lid] = None
            if self._reader is None:
                self._reader = threading.Thread(
                    target=self._read, name=f"allocator-reader-{self._pool.name}", daemon=True
                )
                self._reader.start()
                _at_exit(self)
        try:
            return inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    @property
    def reading(self) -> bool:
        reader = self._reader
        return reader is not None and reader.is_alive()

    def close_connections(self) -> None:
        client = self._owner._client
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            pool.disconnect()
        else:  # RedisCluster keeps a pool per node
            client.close()

    def _recheck_all(self) -> None:
        with self._lock:
            for inbox in self._queues.values():
                inbox.put(_core.RECHECK)

    def _route(self, message: Any) -> None:
        with self._lock:
            inbox = self._queues.get(self._pool.message_target(message))
        if inbox is not None:
            inbox.put(message)
            return
        release = self._pool.release_message(message)
        if release is not None:
            self._owner._drive(self._pool._single(release))

    def _read(self) -> None:
        client, interval = self._owner._client, self._owner._heartbeat
        last_beat = time.monotonic()
        delay = 0.05
        while True:
            with self._lock:
                # Decided under the lock that wait() takes: a waiter that
                # registers after this line starts a new reader.
                if not self._queues:
                    self._reader = None
                    return
            try:
                now = time.monotonic()
                if now - last_beat >= interval:
                    beat = self._pool.heartbeat(self._key, self._next_probe())
                    epoch, probe_ok = self._owner._drive(self._pool._single(beat))
                    if self._pool.recheck_after_beat(epoch, self._epoch, probe_ok, now - last_beat):
                        self._recheck_all()
                    self._epoch, last_beat = epoch, now
                timeout = max(0.01, interval - (time.monotonic() - last_beat))
                popped = client.blpop([self._key], timeout=timeout)
                if popped is not None:
                    self._route(popped[1])
                delay = 0.05
            except _core.TRANSIENT_ERRORS:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            except Exception:
                # Never die silently with waiters parked on it: have each
                # look by itself (its own call shows the error), back off.
                _log.warning("allocator: waiting-list reader failed", exc_info=True)
                self._recheck_all()
                time.sleep(delay)
                delay = min(delay * 2, 2.0)


_READERS: weakref.WeakSet[_Router] = weakref.WeakSet()


def _at_exit(router: _Router) -> None:
    """Remember a router whose reader runs, for the exit hook below."""
    if not _READERS:
        atexit.register(_close_readers)
    _READERS.add(router)


def _close_readers() -> None:
    """At interpreter exit, a reader (a daemon thread) may still be in its
    last blocking read, at most a heartbeat after its last waiter left.
    Close its client's connections, so that no socket is left open (the
    client reconnects if an exit handler still uses it)."""
    for router in list(_READERS):
        if router.reading:
            with contextlib.suppress(Exception):
                router.close_connections()


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
