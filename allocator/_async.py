"""`AsyncFairAllocator`: the asyncio shell around the core.

Waiters of one allocator object share one signal list and one blocking
reader (:class:`Reader`), which routes each grant to its waiter: ten
thousand waiting tasks use one connection for waiting, and one heartbeat
a second keeps all of them alive in the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import (
    Any,
    Literal,
    TypeVar,
    overload,
)

from ._async_io import drive, execute, run_step, senders_of, within
from ._async_reader import Reader, reader_for, readers_of
from ._core.keys import pool_names, pools_pattern
from ._core.pool import Pool
from ._core.presence import presence_budget
from ._core.retry import RETRY_BUDGET
from ._core.steps import Flow, Step
from ._scripts import scripts
from ._transport import (
    bound_client_retries,
    client_kind,
    is_cluster,
    is_sentinel,
    no_client_retries,
)
from ._values import ClientInfo, GCReport, Lease, LeaseInfo, PoolStats, PoolStatus
from .errors import LeaseLost

__all__ = ["AsyncFairAllocator"]

_log = logging.getLogger("allocator")

T = TypeVar("T")
A = TypeVar("A")


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
        min_replicas: int = 0,
        replica_timeout: float = 0.5,
        reclaim_on_disconnect: bool = False,
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
        )
        if client_kind(client) != "async":
            raise TypeError(
                f"client must be an asyncio Redis client for {type(self).__name__}, "
                f"got the blocking {type(client).__module__}.{type(client).__qualname__}: "
                "use FairAllocator with it"
            )
        bound_client_retries(client)
        self._client = client
        self._scripts = scripts()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._pool.name!r}, prefix={self._pool.prefix!r})"

    @property
    def name(self) -> str:
        return self._pool.name

    async def close(self) -> None:
        """Same as :meth:`FairAllocator.close <allocator.FairAllocator.close>`,
        awaitable: the reader of this allocator's client in the running
        event loop (a task) ends, and the releases it started. Also the exit
        of ``async with AsyncFairAllocator(...) as pool:``."""
        for reader in readers_of(self._client):
            await reader.finish()
        for sender in senders_of(self._client):
            await sender.close()

    async def __aenter__(self) -> AsyncFairAllocator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def client(self) -> Any:
        return self._client

    # -- the driver -----------------------------------------------------------

    async def _drive(self, steps: Flow[T]) -> T:
        return await drive(steps, self._step)

    async def _step(self, step: Step) -> Any:
        return await run_step(self._client, self._scripts, step, self._reader)

    def _reader(self) -> Reader:
        return reader_for(self._client, self._pool)

    async def _waiting(
        self, reader: Reader, make: Callable[[str, float], A], timeout: float | None
    ) -> A:
        """Same as the sync shell's ``_waiting``, awaitable."""
        started = time.monotonic()
        flow = make(reader.known_cid(self._pool), started)
        if not reader.joined(self._pool):
            await reader.join(self._pool, presence_budget(timeout))
            flow = make(reader.known_cid(self._pool), started)
        return flow

    async def _drive_waiting(self, reader: Reader, lid: str, steps: Flow[T]) -> T:
        """Same as the sync shell's, awaitable."""
        reader.register(self._pool, lid)
        try:
            return await self._drive(steps)
        finally:
            reader.unregister(lid)

    # -- leasing --------------------------------------------------------------

    @overload
    async def acquire(
        self,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        bind: str | None = ...,
        blocking: Literal[True] = ...,
        owner: str | None = ...,
    ) -> Lease: ...

    @overload
    async def acquire(
        self,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        bind: str | None = ...,
        blocking: bool,
        owner: str | None = ...,
    ) -> Lease | None: ...

    async def acquire(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        blocking: bool = True,
        owner: str | None = None,
    ) -> Lease | None:
        """Same as :meth:`FairAllocator.acquire <allocator.FairAllocator.acquire>`, awaitable.
        Cancelling the task leaves the queue."""
        reader = self._reader()
        flow = await self._waiting(
            reader,
            lambda cid, t0: self._pool.acquire(
                timeout, ttl, bind, blocking, cid=cid, owner=owner, started=t0
            ),
            timeout,
        )
        lease = await self._drive_waiting(reader, flow.lid, flow.steps)
        if lease is not None:
            reader.hold(self._pool, [lease])
        return lease

    @contextlib.asynccontextmanager
    async def lease(
        self,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        bind: str | None = None,
        keepalive: bool = False,
        owner: str | None = None,
    ) -> AsyncIterator[Lease]:
        """Same as :meth:`FairAllocator.lease <allocator.FairAllocator.lease>`, as
        ``async with``; ``keepalive`` renews from a task."""
        if not isinstance(keepalive, bool):
            raise TypeError(f"keepalive must be a bool, not {type(keepalive).__name__}")
        held = await self.acquire(timeout, ttl=ttl, bind=bind, owner=owner)
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

    @overload
    async def acquire_many(
        self,
        count: int,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        blocking: Literal[True] = ...,
        owner: str | None = ...,
    ) -> list[Lease]: ...

    @overload
    async def acquire_many(
        self,
        count: int,
        timeout: float | None = ...,
        *,
        ttl: float | None = ...,
        blocking: bool,
        owner: str | None = ...,
    ) -> list[Lease] | None: ...

    async def acquire_many(
        self,
        count: int,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        owner: str | None = None,
    ) -> list[Lease] | None:
        """Same as :meth:`FairAllocator.acquire_many
        <allocator.FairAllocator.acquire_many>`, awaitable. Cancelling the
        task leaves the queue."""
        reader = self._reader()
        flow = await self._waiting(
            reader,
            lambda cid, t0: self._pool.acquire_many(
                count, timeout, ttl, blocking, cid=cid, owner=owner, started=t0
            ),
            timeout,
        )
        leases = await self._drive_waiting(reader, flow.lid, flow.steps)
        if leases is not None:
            reader.hold(self._pool, leases)
        return leases

    @contextlib.asynccontextmanager
    async def lease_many(
        self,
        count: int,
        timeout: float | None = None,
        *,
        ttl: float | None = None,
        keepalive: bool = False,
        owner: str | None = None,
    ) -> AsyncIterator[list[Lease]]:
        """Same as :meth:`FairAllocator.lease_many
        <allocator.FairAllocator.lease_many>`, as ``async with``;
        ``keepalive`` renews from tasks."""
        if not isinstance(keepalive, bool):
            raise TypeError(f"keepalive must be a bool, not {type(keepalive).__name__}")
        held = await self.acquire_many(count, timeout, ttl=ttl, owner=owner)
        keepers = [_Keeper(self, lease) for lease in held] if keepalive else []
        try:
            yield held
        except BaseException:
            for keeper in keepers:
                await keeper.stop()
            for lease in held:
                with contextlib.suppress(Exception):
                    await self.release(lease)
            raise
        losses = [await keeper.stop() for keeper in keepers]
        released: list[bool | BaseException] = []
        for lease in held:  # every one, whatever happens to another
            try:
                released.append(await self.release(lease))
            except Exception as exc:
                released.append(exc)
        failure = self._pool.lost_many(held, released, losses)
        if failure is not None:
            raise failure

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease:
        """Same as :meth:`FairAllocator.renew <allocator.FairAllocator.renew>`, awaitable."""
        reader = self._reader()
        renewed = await self._drive(self._pool.renew(lease, ttl, reader.lost))
        reader.renewed(renewed)
        return renewed

    def lost(self, lease: Lease) -> bool:
        """Same as :meth:`FairAllocator.lost <allocator.FairAllocator.lost>`
        (no I/O, so not a coroutine)."""
        return self._reader().lost(lease)

    async def release(self, lease: Lease, *, quarantine: float | None = None) -> bool:
        """Same as :meth:`FairAllocator.release <allocator.FairAllocator.release>`, awaitable."""
        reader = self._reader()
        released = await self._drive(self._pool.release(lease, quarantine, reader.lost))
        reader.unhold(lease)
        return released

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

    async def leases(self) -> tuple[LeaseInfo, ...]:
        """Same as :meth:`FairAllocator.leases <allocator.FairAllocator.leases>`, awaitable."""
        return await self._drive(self._pool.leases())

    async def clients(self) -> tuple[ClientInfo, ...]:
        """Same as :meth:`FairAllocator.clients <allocator.FairAllocator.clients>`, awaitable."""
        return await self._drive(self._pool.clients())

    async def stats(self) -> PoolStats:
        """Same as :meth:`FairAllocator.stats <allocator.FairAllocator.stats>`, awaitable."""
        return await self._drive(self._pool.stats())

    async def quarantine(self, resource: str, seconds: float) -> None:
        """Same as :meth:`FairAllocator.quarantine <allocator.FairAllocator.quarantine>`,
        awaitable."""
        return await self._drive(self._pool.quarantine(resource, seconds))

    async def unquarantine(self, resource: str) -> bool:
        """Same as :meth:`FairAllocator.unquarantine <allocator.FairAllocator.unquarantine>`,
        awaitable."""
        return await self._drive(self._pool.unquarantine(resource))

    async def set_events(self, maxlen: int | None) -> None:
        """Same as :meth:`FairAllocator.set_events <allocator.FairAllocator.set_events>`,
        awaitable."""
        return await self._drive(self._pool.set_events(maxlen))

    @property
    def events_key(self) -> str:
        """Same as :attr:`FairAllocator.events_key <allocator.FairAllocator.events_key>`."""
        return self._pool.events_key

    async def revoke(
        self, resource: str | None = None, token: int | None = None, *, lease_id: str | None = None
    ) -> bool:
        """Same as :meth:`FairAllocator.revoke <allocator.FairAllocator.revoke>`,
        awaitable."""
        return await self._drive(self._pool.revoke(resource, token, lease_id))

    async def delete(self, *, force: bool = False) -> bool:
        """Same as :meth:`FairAllocator.delete <allocator.FairAllocator.delete>`, awaitable."""
        return await self._drive(self._pool.delete(force))

    @staticmethod
    async def pools(client: Any, *, prefix: str = "alloc") -> list[str]:
        """Same as :meth:`FairAllocator.pools <allocator.FairAllocator.pools>`, awaitable."""
        pattern = pools_pattern(prefix)
        if is_cluster(client):
            keys = [
                key
                async for key in client.scan_iter(
                    match=pattern, count=1000, target_nodes=client.PRIMARIES
                )
            ]
            return pool_names(keys, prefix)
        # Each SCAN is a single call: its reply comes within the budget of one.
        found: list[Any] = []
        cursor = 0
        with no_client_retries():
            while True:
                due = time.monotonic() + RETRY_BUDGET
                scan = ("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                cursor, batch = await within(execute(client, scan, due), due)
                found.extend(batch)
                if not cursor:
                    return pool_names(found, prefix)


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
        try:
            await self._task
        except asyncio.CancelledError:
            # The keeper's own cancellation ends here; one aimed at the
            # caller (who is awaiting this) goes on.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
        return self._lost
