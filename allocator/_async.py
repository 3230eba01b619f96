"""`AsyncFairAllocator`: the asyncio shell around the core.

Waiters of one allocator object share one signal list and one blocking
reader (:class:`_Reader`), which routes each grant to its waiter: ten
thousand waiting tasks use one connection for waiting, and one heartbeat
a second keeps all of them alive in the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from typing import (
    Any,
    Literal,
    TypeVar,
    overload,
)

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _core
from ._core import Beat, Call, Command, Deliver, Exchange, Flow, Pool, ReaderStep, Step, Wait
from ._scripts import Scripts, scripts
from ._sync import heartbeat_for, is_cluster
from ._transport import bound_client_retries, client_kind, no_client_retries
from ._values import GCReport, Lease, LeaseInfo, PoolStats, PoolStatus
from .errors import LeaseLost

__all__ = ["AsyncFairAllocator"]

_log = logging.getLogger("allocator")

T = TypeVar("T")


async def _call(client: Any, scripts: Scripts, call: Call[T]) -> T:
    """Run a script call and parse its reply (no retries: the caller's)."""
    return call.parse(await _step(client, scripts, call, None))


async def _step(
    client: Any, scripts: Scripts, step: Step, reader: Callable[[], _Reader] | None
) -> Any:
    """Same as the sync shell's ``_step``, awaitable."""
    if isinstance(step, Call):
        with no_client_retries():
            sent = None
            if step.confirm is None:
                command = scripts.known(client, step.script, step.keys, step.args)
                if command is not None:
                    try:
                        return await client.execute_command(*command)
                    except ResponseError as exc:
                        sent = (command, exc)
            commands = scripts.invoke(client, step.script, step.keys, step.args, sent)
            if step.confirm is not None:
                return await _commands(client, _core.confirming(step, commands), step.keys[0])
            return await _commands(client, commands)
    if isinstance(step, Wait):
        assert reader is not None, "a Wait step needs a reader"
        return await reader().wait(step.lid, step.timeout)
    if isinstance(step, Command):
        with no_client_retries():
            return await client.execute_command(*step.args)
    await asyncio.sleep(step.seconds)
    return None


async def _commands(client: Any, commands: Generator[Any, Any, Any], key: str = "") -> Any:
    """Carry out the commands of one script call (``Scripts.invoke``; a
    list of commands is a confirmed call's pipeline, see
    ``_core.confirming``, for the slot of ``key``). A cancellation passes
    straight through: the flow around decides."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            args = commands.send(reply) if error is None else commands.throw(error)
        except StopIteration as stop:
            return stop.value
        reply, error = None, None
        try:
            if isinstance(args, list):
                send = _send_to_slot if is_cluster(client) else _send_pipelined
                reply = await send(client, args, key)
            else:
                reply = await client.execute_command(*args)
        except Exception as exc:  # handed to the flow, which decides
            error = exc


async def _send_pipelined(client: Any, commands: list[tuple[Any, ...]], key: str) -> list[Any]:
    """Same as the sync shell's ``_send_pipelined``, awaitable."""
    async with client.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return await pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]


async def _send_to_slot(client: Any, commands: list[tuple[Any, ...]], key: str) -> list[Any]:
    """Same as the sync shell's ``_send_to_slot``: one connection to the
    master of the pool's slot."""
    await client.initialize()  # a no-op once the client knows the slots
    node = client.get_node_from_key(key)
    conn = node.acquire_connection()
    try:
        await conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await conn.disconnect()
        if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
            with contextlib.suppress(Exception):
                await client.nodes_manager.initialize()
        raise
    finally:
        release = getattr(node, "release", None)
        if release is not None:
            release(conn)
        else:  # redis-py < 5.1: the node keeps its free connections itself
            node._free.append(conn)
    if _core.moved(replies):
        await client.nodes_manager.initialize()  # learn the new owner of the slot
    return replies


async def _drive(steps: Flow[T], run: Callable[[Step], Awaitable[Any]]) -> T:
    """Same as the sync shell's ``_drive``, awaitable."""
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
            reply = await run(step)
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
    ) -> None:
        self._pool = Pool.create(
            name,
            lease_ttl=lease_ttl,
            bind_ttl=bind_ttl,
            prefix=prefix,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
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

    @property
    def client(self) -> Any:
        return self._client

    # -- the driver -----------------------------------------------------------

    async def _drive(self, steps: Flow[T]) -> T:
        return await _drive(steps, self._step)

    async def _step(self, step: Step) -> Any:
        return await _step(self._client, self._scripts, step, self._reader)

    def _reader(self) -> _Reader:
        return reader_for(self._client, self._pool)

    async def _drive_waiting(self, reader: _Reader, lid: str, steps: Flow[T]) -> T:
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
        flow = self._pool.acquire(timeout, ttl, bind, blocking, cid=reader.cid, owner=owner)
        return await self._drive_waiting(reader, flow.lid, flow.steps)

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
        flow = self._pool.acquire_many(count, timeout, ttl, blocking, cid=reader.cid, owner=owner)
        return await self._drive_waiting(reader, flow.lid, flow.steps)

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

    async def leases(self) -> tuple[LeaseInfo, ...]:
        """Same as :meth:`FairAllocator.leases <allocator.FairAllocator.leases>`, awaitable."""
        return await self._drive(self._pool.leases())

    async def stats(self) -> PoolStats:
        """Same as :meth:`FairAllocator.stats <allocator.FairAllocator.stats>`, awaitable."""
        return await self._drive(self._pool.stats())

    async def quarantine(self, resource: str, seconds: float) -> None:
        """Same as :meth:`FairAllocator.quarantine <allocator.FairAllocator.quarantine>`,
        awaitable."""
        return await self._drive(self._pool.quarantine(resource, seconds))

    async def delete(self, *, force: bool = False) -> bool:
        """Same as :meth:`FairAllocator.delete <allocator.FairAllocator.delete>`, awaitable."""
        return await self._drive(self._pool.delete(force))

    @staticmethod
    async def pools(client: Any, *, prefix: str = "alloc") -> list[str]:
        """Same as :meth:`FairAllocator.pools <allocator.FairAllocator.pools>`, awaitable."""
        pattern = _core.pools_pattern(prefix)
        if is_cluster(client):
            keys = [
                key
                async for key in client.scan_iter(
                    match=pattern, count=1000, target_nodes=client.PRIMARIES
                )
            ]
        else:
            keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
        return _core.pool_names(keys, prefix)


def _cancelling(task: asyncio.Task[Any] | None) -> int:
    """Cancellation requests pending on ``task`` (Python >= 3.11; else 0)."""
    counter = getattr(task, "cancelling", None)
    return int(counter()) if counter is not None else 0


class _Reader:
    """Same as the sync shell's reader, as a task: the one blocking reader of
    an asyncio Redis client in one event loop (of a cluster client: per hash
    slot), for every pool whose waiters use that client. It ends when nobody
    is left to wait or to acknowledge, after its current read (it is not
    cancelled: a read cut short would cost the connection)."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._client = client
        self._scripts = scripts()
        self._cluster = is_cluster(client)
        self.hub = _core.Hub(heartbeat_for(client) if self._cluster else _core.HEARTBEAT)
        self._task: asyncio.Task[None] | None = None
        self._chores: set[asyncio.Task[Any]] = set()
        self._conn: Any = None

    @property
    def cid(self) -> str:
        return self.hub.cid

    def register(self, pool: Pool, lid: str) -> None:
        self.hub.register(pool, lid, asyncio.Queue())

    def unregister(self, lid: str) -> None:
        self.hub.unregister(lid)

    async def wait(self, lid: str, timeout: float | None) -> Any:
        inbox = self.hub.inbox(lid)
        if self._task is None:
            self._task = self.loop.create_task(self._run())
        try:
            return await asyncio.wait_for(inbox.get(), timeout)
        except TimeoutError:
            return self.hub.trouble

    async def _run(self) -> None:
        rounds = self.hub.rounds(self.loop.time)
        reply: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    step = rounds.send(reply) if error is None else rounds.throw(error)
                except StopIteration:
                    return
                reply, error = None, None
                try:
                    reply = await self._carry(step)
                except Exception as exc:  # handed to the loop, which decides
                    await self._drop_connection()
                    error = exc
        except asyncio.CancelledError:
            # The loop is shutting down: a read cut short leaves its
            # connection unusable.
            await self._drop_connection()
            raise
        finally:
            if self._task is asyncio.current_task():
                self._task = None
            await self._release_connection()

    async def _carry(self, step: ReaderStep) -> Any:
        """Same as the sync reader's, awaitable; a release runs as a task
        of its own, so that the round goes on meanwhile."""
        if isinstance(step, Exchange):
            return await self._exchange(step.acks, step.keys, step.block)
        if isinstance(step, Beat):
            return [
                (key, await _call(self._client, self._scripts, call)) for key, call in step.calls
            ]
        if isinstance(step, Deliver):
            for inbox, item in step.items:
                inbox.put_nowait(item)
            for call in step.releases:
                chore = self.loop.create_task(_drive(Pool._single(call), self._step))
                self._chores.add(chore)
                chore.add_done_callback(self._chores.discard)
            return None
        await asyncio.sleep(step.seconds)
        return None

    async def _step(self, step: Step) -> Any:
        return await _step(self._client, self._scripts, step, None)

    async def _exchange(
        self, acks: list[tuple[str, list[str]]], keys: list[str], block: float
    ) -> list[tuple[Any, Any]]:
        """Same as the sync reader's round: one round trip."""
        client = self._client
        if self._cluster:
            with no_client_retries():
                for pick, lids in acks:
                    await client.zrem(pick, *lids)
                if not keys:
                    return []
                first = await client.blpop(keys, timeout=block)
                rest = [(key, await client.lpop(key, _core.BATCH)) for key in keys] if first else []
            return _core.popped(first, rest)
        conn = self._conn
        if conn is None:
            conn = self._conn = await _get_connection(client.connection_pool)
        commands = _core.round_commands(acks, keys, block)
        await conn.send_packed_command(conn.pack_commands(commands))
        replies = []
        for _ in commands:
            try:
                replies.append(await conn.read_response(timeout=block + _core.READ_SLACK))
            except ResponseError as exc:
                replies.append(exc)
        return _core.round_replies(commands, replies)

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            with contextlib.suppress(Exception):
                await self._client.connection_pool.release(conn)

    async def _release_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await self._client.connection_pool.release(conn)


async def _get_connection(pool: Any) -> Any:
    """A connection of the client's own pool (redis-py < 5.3 wants a command name)."""
    try:
        return await pool.get_connection()
    except TypeError:
        return await pool.get_connection("BLPOP")


_REGISTRY: weakref.WeakKeyDictionary[Any, dict[tuple[int, int | None], _Reader]] = (
    weakref.WeakKeyDictionary()
)


def reader_for(client: Any, pool: Pool) -> _Reader:
    """The reader of ``client`` in the running event loop (of a cluster
    client: for the pool's slot), made on first use."""
    loop = asyncio.get_running_loop()
    where = (id(loop), pool.slot if is_cluster(client) else None)
    readers = _REGISTRY.setdefault(client, {})
    reader = readers.get(where)
    if reader is None or reader.loop is not loop:
        reader = readers[where] = _Reader(client, loop)
    return reader


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
