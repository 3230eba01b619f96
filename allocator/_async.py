"""`AsyncFairAllocator`: the asyncio shell around the core.

Waiters of one allocator object share one signal list and one blocking
reader (:class:`_Router`), which routes each grant to its waiter: ten
thousand waiting tasks use one connection for waiting, and one heartbeat
a second keeps all of them alive in the queue.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import (
    Any,
    Literal,
    TypeVar,
    overload,
)

from redis.exceptions import NoScriptError

from . import _core
from ._core import Call, Command, Flow, Pool, Step, Wait
from ._scripts import scripts
from ._sync import heartbeat_for
from ._transport import bound_client_retries, client_kind, no_client_retries
from ._values import GCReport, Lease, PoolStatus
from .errors import LeaseLost

__all__ = ["AsyncFairAllocator"]

_log = logging.getLogger("allocator")

T = TypeVar("T")


class AsyncFairAllocator:
    """Same as :class:`~allocator.FairAllocator`, for asyncio: every method
    is a coroutine, and ``lease()`` is an async context manager.

    ``client`` is a ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster`` (or fakeredis ``FakeAsyncRedis``).
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
        if client_kind(client) != "async":
            raise TypeError(
                f"client must be an asyncio Redis client for {type(self).__name__}, "
                f"got the blocking {type(client).__module__}.{type(client).__qualname__}: "
                "use FairAllocator with it"
            )
        bound_client_retries(client)
        self._client = client
        self._scripts = scripts()
        self._heartbeat = heartbeat_for(client)
        self._router: _Router | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._pool.name!r}, prefix={self._pool.prefix!r})"

    @property
    def name(self) -> str:
        return self._pool.name

    @property
    def client(self) -> Any:
        return self._client

    # -- the driver -----------------------------------------------------------

    async def _drive(self, steps: Flow[T]) -> T:
        task = asyncio.current_task()
        cancels = _cancelling(task)
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply, error = None, None
            try:
                reply = await self._step(step)
                # redis-py's asyncio client finishes a command that a
                # cancellation interrupted and returns its reply, swallowing
                # the CancelledError (redis/redis-py#2028, #2666). The task
                # still counts the request: deliver it, so that a cancelled
                # acquire leaves the queue instead of waiting on.
                if _cancelling(task) > cancels:
                    cancels = _cancelling(task)
                    raise asyncio.CancelledError()
            except BaseException as exc:  # handed to the flow, which decides
                error = exc

    async def _step(self, step: Step) -> Any:
        if isinstance(step, Call):
            keys, args = step.keys, step.args
            with no_client_retries():
                try:
                    return await self._client.evalsha(
                        self._scripts.sha[step.script], len(keys), *keys, *args
                    )
                except NoScriptError:
                    # Flushed, restarted, failed over: run it by its text,
                    # which caches it again. Unlike SCRIPT LOAD then EVALSHA,
                    # no flush can land in between.
                    text = self._scripts.text[step.script]
                    return await self._client.eval(text, len(keys), *keys, *args)
        if isinstance(step, Wait):
            return await self._get_router().wait(step.lid, step.timeout)
        if isinstance(step, Command):
            with no_client_retries():
                return await self._client.execute_command(*step.args)
        await asyncio.sleep(step.seconds)
        return None

    def _get_router(self) -> _Router:
        loop = asyncio.get_running_loop()
        if self._router is None or self._router.loop is not loop:
            self._router = _Router(self, loop)
        return self._router

    # -- leasing --------------------------------------------------------------

    @overload
    async def acquire(
        self,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        bind: str | None = ...,
        blocking: Literal[True] = ...,
    ) -> Lease: ...

    @overload
    async def acquire(
        self,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        bind: str | None = ...,
        blocking: bool,
    ) -> Lease | None: ...

    async def acquire(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        blocking: bool = True,
    ) -> Lease | None:
        """Same as :meth:`FairAllocator.acquire <allocator.FairAllocator.acquire>`, awaitable.
        Cancelling the task leaves the queue."""
        flow = self._pool.acquire(timeout, ttl, bind, blocking)
        router = self._get_router()
        router.register(flow.lid)
        try:
            return await self._drive(flow.steps)
        finally:
            router.unregister(flow.lid)

    @contextlib.asynccontextmanager
    async def lease(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        keepalive: bool = False,
    ) -> AsyncIterator[Lease]:
        """Same as :meth:`FairAllocator.lease <allocator.FairAllocator.lease>`, as
        ``async with``; ``keepalive`` renews from a task."""
        if not isinstance(keepalive, bool):
            raise TypeError(f"keepalive must be a bool, not {type(keepalive).__name__}")
        held = await self.acquire(timeout, ttl=ttl, bind=bind)
        keeper = _Keeper(self, held) if keepalive else None
        try:
            yield held
        except BaseException:
            if keeper is not None:
                await keeper.stop()
            with contextlib.suppress(Exception):
                await self.release(held)
            raise
        lost = await keeper.stop() if keeper is not None else None
        if not await self.release(held) or lost is not None:
            raise lost or LeaseLost(self.name, held.resource, held.token, "lost while held")

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease:
        """Same as :meth:`FairAllocator.renew <allocator.FairAllocator.renew>`, awaitable."""
        return await self._drive(self._pool.renew(lease, ttl))

    async def release(self, lease: Lease, *, quarantine: float | None = None) -> bool:
        """Same as :meth:`FairAllocator.release <allocator.FairAllocator.release>`, awaitable."""
        return await self._drive(self._pool.release(lease, quarantine))

    # -- administration -------------------------------------------------------

    async def extend(
        self,
        resources: Iterable[str],
        *,
        capacity: int = 1,
        priority: float = 0,
        rate: tuple[int, float] | None = None,
    ) -> int:
        """Same as :meth:`FairAllocator.extend <allocator.FairAllocator.extend>`, awaitable."""
        return await self._drive(self._pool.extend(resources, capacity, priority, rate))

    async def remove(self, resources: Iterable[str], *, force: bool = False) -> int:
        """Same as :meth:`FairAllocator.remove <allocator.FairAllocator.remove>`, awaitable."""
        return await self._drive(self._pool.remove(resources, force))

    async def bind(self, name: str, resource: str) -> None:
        """Same as :meth:`FairAllocator.bind <allocator.FairAllocator.bind>`, awaitable."""
        return await self._drive(self._pool.bind(name, resource))

    async def unbind(self, name: str) -> bool:
        """Same as :meth:`FairAllocator.unbind <allocator.FairAllocator.unbind>`, awaitable."""
        return await self._drive(self._pool.unbind(name))

    async def status(self) -> PoolStatus:
        """Same as :meth:`FairAllocator.status <allocator.FairAllocator.status>`, awaitable."""
        return await self._drive(self._pool.status())

    async def gc(self) -> GCReport:
        """Same as :meth:`FairAllocator.gc <allocator.FairAllocator.gc>`, awaitable."""
        return await self._drive(self._pool.gc())


def _cancelling(task: asyncio.Task[Any] | None) -> int:
    """Cancellation requests pending on ``task`` (Python >= 3.11; else 0)."""
    counter = getattr(task, "cancelling", None)
    return int(counter()) if counter is not None else 0


class _Router:
    """One blocking reader per allocator and event loop.

    It pops the client's signal list and hands each message to the waiter it
    names. A grant for a waiter that already left is released, so that it
    passes on at once instead of after the pick-up window. Once a heartbeat
    interval it runs the client-level poll that keeps all local waiters
    alive; if the pool's epoch changed (its data was lost) or the loop was
    stalled past the liveness window, every waiter checks its ticket.
    The reader ends when no waiter is left.
    """

    def __init__(self, owner: AsyncFairAllocator, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._owner = owner
        self._pool = owner._pool
        self._key = self._pool.signal_key(self._pool.client_id)
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._chores: set[asyncio.Task[Any]] = set()
        self._epoch: str | None = None
        # Waiters that have waited, probed in turn (O(1) add, remove, rotate).
        self._probes: collections.OrderedDict[str, None] = collections.OrderedDict()

    def register(self, lid: str) -> None:
        self._queues[lid] = asyncio.Queue()

    def unregister(self, lid: str) -> None:
        self._queues.pop(lid, None)
        self._probes.pop(lid, None)
        if not self._queues and self._reader is not None:
            # Nobody left to route to: stop reading now, so that the reader
            # holds no connection of a client its owner may be closing. A
            # grant it may have popped in flight belongs to a waiter whose
            # cancel script already passed that grant on.
            self._reader.cancel()
            self._reader = None

    def _next_probe(self) -> str:
        if not self._probes:
            return ""
        lid = next(iter(self._probes))
        self._probes.move_to_end(lid)
        return lid

    async def wait(self, lid: str, timeout: float | None) -> Any:
        self._probes[lid] = None
        if self._reader is None:
            self._reader = self.loop.create_task(self._read())
        queue = self._queues[lid]
        try:
            return await asyncio.wait_for(queue.get(), timeout)
        except TimeoutError:
            return None

    def _recheck_all(self) -> None:
        for queue in self._queues.values():
            queue.put_nowait(_core.RECHECK)

    def _route(self, message: Any) -> None:
        queue = self._queues.get(self._pool.message_target(message))
        if queue is not None:
            queue.put_nowait(message)
            return
        release = self._pool.release_message(message)
        if release is not None:
            chore = self.loop.create_task(self._owner._drive(self._pool._single(release)))
            self._chores.add(chore)
            chore.add_done_callback(self._chores.discard)

    async def _read(self) -> None:
        client, interval = self._owner._client, self._owner._heartbeat
        me = asyncio.current_task()
        last_beat = self.loop.time()
        delay = 0.05
        try:
            while self._queues and me is self._reader:
                try:
                    now = self.loop.time()
                    if now - last_beat >= interval:
                        beat = self._pool.heartbeat(self._key, self._next_probe())
                        epoch, probe_ok = await self._owner._drive(self._pool._single(beat))
                        silent = now - last_beat
                        if self._pool.recheck_after_beat(epoch, self._epoch, probe_ok, silent):
                            self._recheck_all()
                        self._epoch, last_beat = epoch, now
                    timeout = max(0.01, interval - (self.loop.time() - last_beat))
                    popped = await client.blpop([self._key], timeout=timeout)
                    if popped is not None:
                        self._route(popped[1])
                    delay = 0.05
                except _core.TRANSIENT_ERRORS:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                except Exception:
                    # Never die silently with waiters parked on it: have each
                    # look by itself (its own call shows the error), back off.
                    _log.warning("allocator: waiting-list reader failed", exc_info=True)
                    self._recheck_all()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
        finally:
            # A reader detached by unregister() must not clear its successor.
            if self._reader is me:
                self._reader = None


class _Keeper:
    """Renews a lease every ttl/3 from a task until stopped."""

    def __init__(self, owner: AsyncFairAllocator, lease: Lease) -> None:
        self._owner = owner
        self._lease = lease
        self._lost: LeaseLost | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._lease.ttl / 3)
            try:
                self._lease = await self._owner.renew(self._lease)
            except LeaseLost as lost:
                self._lost = lost
                return
            except Exception:  # a transport error: try again next interval
                continue

    async def stop(self) -> LeaseLost | None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self._lost
