"""Asyncio I/O for the core's steps: the same as :mod:`allocator._sync_io`,
awaitable; the reader of one client and event loop is carried out by its
waiting tasks in turn.

A step's deadline bounds the whole step (:func:`within`): its commands,
connects and handshakes included, are cancelled when it passes. redis-py
closes a connection whose read or write was cut short, so none goes back
to the pool with a reply still to come. Such a command runs on a connection
taken from the client's pool (:func:`execute`): skipping redis-py's retry
wrapper and metrics there pays for the timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Generator
from typing import (
    Any,
    TypeVar,
)

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core import reader as core
from ._core.lead import (
    LEAD,
    PARTIAL,
    THREAD,
    Lead,
    block_for,
    read_wait,
    step_error,
    take_item,
)
from ._core.pending import CLOSE_WAIT, TRY, Ends, Reclaimable
from ._core.pool import Pool
from ._core.presence import HEARTBEAT_PRESENT, PRESENT, PROBE_WAIT, Holds
from ._core.reader import (
    ACK_DELAY,
    READ_SLACK,
    multipop_refused,
    round_commands,
    round_replies,
)
from ._core.replicas import confirming, moved
from ._core.retry import RETRY_BUDGET, retry_single
from ._core.steps import (
    Beat,
    Call,
    Command,
    Defer,
    Deliver,
    Exchange,
    Flow,
    Pending,
    ReaderStep,
    Settle,
    Sleep,
    Step,
    Subscribe,
    Wait,
)
from ._presence import AsyncPresence, refused
from ._scripts import Scripts, scripts
from ._transport import (
    heartbeat_for,
    in_process,
    is_cluster,
    keeps_presence,
    no_client_retries,
    pooled,
)
from ._values import Lease

__all__ = [
    "Reader",
    "Sender",
    "drive",
    "execute",
    "reader_for",
    "run_call",
    "run_step",
    "sender_for",
    "within",
]

_log = logging.getLogger("allocator")

T = TypeVar("T")


async def run_call(client: Any, scripts: Scripts, call: Call[T]) -> T:
    """Run a script call and parse its reply (no retries: the caller's)."""
    return call.parse(await run_step(client, scripts, call, None))


async def run_step(
    client: Any, scripts: Scripts, step: Step, reader: Callable[[], Reader] | None
) -> Any:
    """Same as the sync shell's ``_step``, awaitable."""
    if isinstance(step, Call):
        with no_client_retries():
            if step.deadline is None:
                return await _call(client, scripts, step)
            return await within(_call(client, scripts, step), step.deadline)
    if isinstance(step, Wait):
        assert reader is not None, "a Wait step needs a reader"
        return await reader().wait(step.lid, step.timeout)
    if isinstance(step, Command):
        with no_client_retries():
            return await within(execute(client, step.args, step.deadline), step.deadline)
    if isinstance(step, (Defer, Settle, Pending)):
        return sender_for(client).take(step)
    await asyncio.sleep(step.seconds)
    return None


async def _call(client: Any, scripts: Scripts, step: Call[Any]) -> Any:
    """The commands of a script call, and its reply."""
    due = step.deadline
    sent = None
    if step.confirm is None:
        command = scripts.known(client, step.script, step.keys, step.args)
        if command is not None:
            try:
                return await execute(client, command, due)
            except ResponseError as exc:
                sent = (command, exc)
    commands = scripts.invoke(client, step.script, step.keys, step.args, sent)
    if step.confirm is not None:
        return await _commands(client, confirming(step, commands), due, step.keys[0])
    return await _commands(client, commands, due)


async def execute(client: Any, args: tuple[Any, ...], due: float | None) -> Any:
    """Run one command on ``client`` and return its parsed reply; with a
    deadline, on a connection of the client's pool (a cluster client, or a
    single-connection one, picks its connection inside redis-py). The
    caller bounds it (:func:`within`)."""
    if due is None or not pooled(client):
        return await client.execute_command(*args)
    pool = client.connection_pool
    conn = await _get_connection(pool)
    try:
        await conn.send_command(*args)
        return await client.parse_response(conn, args[0])
    finally:
        # redis-py closed it if its read or write was cut short.
        await pool.release(conn)


async def within(work: Awaitable[T], due: float | None) -> T:
    """Await ``work``; with a deadline ``due`` (monotonic seconds), cancel
    it then and raise redis-py's ``TimeoutError``, a transport error the
    flow retries within its own deadline."""
    if due is None:
        return await work
    left = max(due - time.monotonic(), 0.001)
    try:
        async with asyncio.timeout(left):
            return await work
    except TimeoutError as exc:
        raise RedisTimeoutError(f"no reply from Redis within {left:.3f}s") from exc


async def _commands(
    client: Any, commands: Generator[Any, Any, Any], due: float | None, key: str = ""
) -> Any:
    """Carry out the commands of one script call (``Scripts.invoke``; a
    list of commands is a confirmed call's pipeline, see
    ``_core.replicas.confirming``, for the slot of ``key``). A cancellation passes
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
                reply = await execute(client, args, due)
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
        _give_to_node(node, conn)
    if moved(replies):
        await client.nodes_manager.initialize()  # learn the new owner of the slot
    return replies


async def drive(steps: Flow[T], run: Callable[[Step], Awaitable[Any]]) -> T:
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


def _cancelling(task: asyncio.Task[Any] | None) -> int:
    """Cancellation requests pending on ``task`` (Python >= 3.11; else 0)."""
    counter = getattr(task, "cancelling", None)
    return int(counter()) if counter is not None else 0


class Reader:
    """Same as the sync shell's reader (leader and followers), for the
    tasks of one event loop: the one blocking reader of an asyncio Redis
    client in that loop (of a cluster client: per hash slot), for every
    pool whose waiters use that client. The first waiting task leads and
    awaits the rounds itself; when its own message comes, or its time runs
    out, it hands the lead to the task that has waited longest. With nobody
    left to wait, acknowledgements wait ``ACK_DELAY`` for the next waiter's
    round, then a task of the reader's own sends them and ends."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop, key: str) -> None:
        self.loop = loop
        self._client = client
        self._scripts = scripts()
        self._cluster = is_cluster(client)
        self.core = core.Reader(heartbeat_for(client) if self._cluster else HEARTBEAT_PRESENT)
        self.lead = Lead(self.core)
        self._task: asyncio.Task[None] | None = None
        self._chores: set[asyncio.Task[Any]] = set()
        self._conn: Any = None
        #: On a cluster, the node ``_conn`` came from.
        self._node: Any = None
        self.presence = AsyncPresence(client, key) if keeps_presence(client) else None
        self.holds = Holds()
        self._watcher: asyncio.Task[None] | None = None
        self._beat_generation = 0
        #: Whether the server has BLMPOP (one command a round), until it
        #: refuses it. Not fakeredis: its BLMPOP leaves an emptied list
        #: behind as a key.
        self._multipop = not in_process(client)
        self.reclaimable = Reclaimable()

    @property
    def cid(self) -> str:
        return self.core.cid

    async def cid_for(self, pool: Pool, budget: float = RETRY_BUDGET) -> str:
        """Same as the sync reader's, awaitable."""
        await self.join(pool, budget)
        return self.known_cid(pool)

    def known_cid(self, pool: Pool) -> str:
        return self.core.presences.cid_for(pool)

    def joined(self, pool: Pool) -> bool:
        return self.core.presences.decided(pool)

    async def join(self, pool: Pool, budget: float) -> None:
        """Same as the sync reader's, awaitable."""
        if self.joined(pool):
            return
        channel = self.core.presences.channel(pool)
        kept = False if self.presence is None else await self.presence.join(channel, budget)
        if kept is not None:  # None: the server was out of reach; next time
            self.core.presences.decide(pool, kept)

    # -- what the client holds: the presence watch -----------------------------

    def hold(self, pool: Pool, leases: list[Lease]) -> None:
        """Same as the sync reader's; the watch is a task."""
        if self.presence is None or not self.core.presences.cid_for(pool).startswith(PRESENT):
            return
        now = self.loop.time()
        for lease in leases:
            self.holds.hold(lease.id, now, lease.ttl, pool.reclaim_on_disconnect)
            if pool.reclaim_on_disconnect:
                self.reclaimable.hold(pool.name, pool.keys, lease, now)
        self._ensure_watch()

    def _ensure_watch(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = self.loop.create_task(self._watch())

    def renewed(self, lease: Lease) -> None:
        self.holds.renewed(lease.id, self.loop.time(), lease.ttl)
        self.reclaimable.renewed(lease, self.loop.time())

    def unhold(self, lease: Lease) -> None:
        self.holds.drop(lease.id, self.loop.time())
        self.reclaimable.drop(lease.id)

    def _release_given_up(self) -> None:
        """Same as the sync reader's."""
        now = self.loop.time()
        for step in self.reclaimable.given_up(lambda lid: self.holds.lost(lid, now), now):
            sender_for(self._client).take(step)

    def lost(self, lease: Lease) -> bool:
        return self.holds.lost(lease.id, self.loop.time())

    async def _watch(self) -> None:
        """Same as the sync reader's, as a task."""
        presence = self.presence
        assert presence is not None
        while (period := self.holds.period(self.loop.time(), self.core.waiting)) is not None:
            self._release_given_up()
            if self.holds.fresh:  # the last confirmation of the return failed
                await self._confirm_return()
            heard = await presence.listen(period)
            connected = heard is not None
            if heard:  # the ends of leases the server told (Holds.heard)
                self.holds.heard(heard)
            if _cancelling(asyncio.current_task()):
                # (redis-py's timed read can take a cancellation for its
                # own timeout and return: the watch ends all the same.)
                raise asyncio.CancelledError
            if connected and self.holds.probing:
                sent = self.loop.time()
                answer = await presence.probe(PROBE_WAIT)
                if not self.holds.probed(answer, sent, self.loop.time()):
                    continue
            elif connected:
                continue
            channels = self.core.presences.channels()
            if not channels:
                await asyncio.sleep(period)
                continue
            tried = self.loop.time()
            try:
                await self._subscribe_again(channels)
            except Exception as exc:  # tried again after a short pause
                _log.debug("allocator: presence not subscribed again yet: %r", exc)
                if refused(self._client, exc):
                    self.holds.refused(tried)
                await asyncio.sleep(self.holds.retry_in())

    async def _subscribe_again(self, channels: list[str], generation: int | None = None) -> None:
        """Same as the sync reader's."""
        assert self.presence is not None
        if generation is not None and generation != self.presence.generation:
            return
        self.holds.resubscribing()
        await self.presence.renew(channels)
        await self._confirm_return()

    async def _confirm_return(self) -> None:
        """Same as the sync reader's."""
        calls = self.core.presences.confirms()
        sent = self.loop.time()
        try:
            answers = [await run_call(self._client, self._scripts, call) for call in calls]
        except Exception as exc:  # the watch tries again
            _log.debug("allocator: presence return not confirmed yet: %r", exc)
            return
        if 0 not in answers:
            self.holds.returned(sent)

    def register(self, pool: Pool, lid: str) -> None:
        self.core.register(pool, lid, asyncio.Queue())
        if self.presence is not None and self.core.presences.cid_for(pool).startswith(PRESENT):
            self._ensure_watch()

    def unregister(self, lid: str) -> None:
        self.core.unregister(lid)
        self._wake(self.lead.kick())

    async def wait(self, lid: str, timeout: float | None) -> Any:
        """Same as the sync reader's, awaitable."""
        deadline = None if timeout is None else self.loop.time() + timeout
        inbox = self.core.inbox(lid)
        try:
            while True:
                item = take_item(inbox)
                if item is not LEAD:
                    return item
                if self.lead.take(lid, inbox, self.loop.time):
                    await self._lead(lid, inbox, deadline)
                    if inbox.empty():  # its time ran out, or the rounds ended
                        return self.core.trouble
                    continue
                span = None if deadline is None else max(deadline - self.loop.time(), 0.0)
                try:
                    item = await asyncio.wait_for(inbox.get(), span)
                except TimeoutError:
                    return self.core.trouble
                if item is not LEAD:
                    return item
        finally:
            self._wake(self.lead.leave(lid))

    async def finish(self) -> None:
        """Same as the sync reader's: unless somebody waits on it, let the
        reading end (within about a heartbeat) and the releases it started,
        and give the connection back."""
        task = None if self.core.waiting else self._task
        if task is not None and task is not asyncio.current_task():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self.core.heartbeat + READ_SLACK)
        if self._chores:
            await asyncio.gather(*self._chores, return_exceptions=True)
        if not self.core.waiting and self.lead.leader is None and not self.lead.reading:
            await self._release_connection()
        if self.presence is not None and not self.core.waiting and not self.holds.holding:
            if self._watcher is not None:
                self._watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._watcher
                self._watcher = None
            await self.presence.close()
            self.core.forget_presence()

    @property
    def reading(self) -> bool:
        """Rounds are under way (somebody waits, or is left to acknowledge)."""
        return self.lead.reading

    # -- the lead -------------------------------------------------------------

    async def _lead(self, me: Any, inbox: Any, deadline: float | None) -> None:
        """Same as the sync reader's, awaitable."""
        while True:
            step = self.lead.next_step(me, inbox, deadline, self.loop.time())
            if step is None:
                if not self.lead.reading:  # the rounds ended: nobody waits
                    await self._release_connection()
                return
            try:
                reply = await self._carry(step, deadline)
            except BaseException as exc:
                if not step_error(me, exc):
                    # Cancelled (the loop shuts down, a caller's own
                    # timeout), or anything else that is not the step's
                    # own error: the step is left to the next leader, and
                    # the connection, a reply perhaps half read, is not
                    # used again.
                    self._drop_connection()
                    raise
                # Handed to the rounds, which decide.
                conn, self._conn = self._conn, None
                if conn is not None:
                    await self._discard(conn)
                self.lead.done(None, exc)
            else:
                if reply is not PARTIAL:
                    self.lead.done(reply, None)

    def _wake(self, whom: Any) -> None:
        """Same as the sync reader's: hand the lead to a follower, or start
        the reader's own task."""
        if whom is THREAD:
            if self._task is None or self._task.done():
                self._task = self.loop.create_task(self._run())
        elif whom is not None:
            whom.put_nowait(LEAD)

    async def _run(self) -> None:
        await asyncio.sleep(ACK_DELAY)
        if not self.lead.thread_takes():
            return  # a waiter leads, or comes to lead
        try:
            await self._lead(THREAD, None, None)
        finally:
            self._wake(self.lead.leave(THREAD))

    async def _carry(self, step: ReaderStep, deadline: float | None) -> Any:
        """Same as the sync reader's, awaitable; a release runs as a task
        of its own, so that the round goes on meanwhile."""
        if isinstance(step, Exchange):
            now = self.loop.time()
            block = block_for(step, deadline, now)
            wait = read_wait(block, deadline, now)
            return await self._exchange(step.acks, step.keys, block, wait)
        if isinstance(step, Beat):
            if self.presence is not None:
                self._beat_generation = self.presence.generation
            return [
                (key, await run_call(self._client, self._scripts, call)) for key, call in step.calls
            ]
        if isinstance(step, Deliver):
            for inbox, item in step.items:
                inbox.put_nowait(item)
            for call in step.releases:
                chore = self.loop.create_task(drive(retry_single(call), self._run_step))
                self._chores.add(chore)
                chore.add_done_callback(self._chores.discard)
            return None
        if isinstance(step, Subscribe):
            if self.presence is not None:
                try:
                    await self._subscribe_again(step.channels, self._beat_generation)
                except Exception as exc:  # the presence watch tries again
                    _log.debug("allocator: presence not subscribed again yet: %r", exc)
            return None
        seconds, over = self.lead.pause(step.seconds, deadline, self.loop.time())
        await asyncio.sleep(seconds)
        return None if over else PARTIAL

    async def _run_step(self, step: Step) -> Any:
        return await run_step(self._client, self._scripts, step, None)

    async def _exchange(
        self, acks: list[tuple[str, list[str]]], keys: list[str], block: float, wait: float
    ) -> list[tuple[Any, Any]]:
        """Same as the sync reader's round: one round trip (on a cluster, to
        the master of the reader's slot)."""
        conn = self._conn
        if conn is None:
            # Connected (anew after a drop) within the round's own time.
            due = time.monotonic() + wait
            conn = self._conn = await within(self._connect(keys or [pick for pick, _ in acks]), due)
        commands = round_commands(acks, keys, block, self._multipop)
        replies = []
        # One bound for the round's replies: redis-py's asyncio
        # read_response(timeout=...) answers None when it runs out and leaves
        # the reply to come on the connection, so that later rounds would
        # read the replies of earlier ones. A round cut short here raises,
        # and the reader drops its connection.
        try:
            await conn.send_packed_command(conn.pack_commands(commands))
            async with asyncio.timeout(wait):
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
        except TimeoutError:
            await self._relearn_slots()
            raise RedisTimeoutError("no reply from the server to the reader's round") from None
        except (RedisConnectionError, RedisTimeoutError):
            await self._relearn_slots()
            raise
        if self._cluster and moved(replies):
            await self._relearn_slots()
        if self._multipop and multipop_refused(commands, replies):
            self._multipop = False  # Redis 6.2: BLPOP rounds from now on
            return await self._exchange(acks, keys, block, wait)
        return round_replies(commands, replies)

    async def _connect(self, keys: list[str]) -> Any:
        """A connection for the reader's rounds: of the client's pool, or on
        a cluster a connection of its own to the master of ``keys``' slot."""
        if not self._cluster:
            return await _get_connection(self._client.connection_pool)
        await self._client.initialize()  # a no-op once the client knows the slots
        self._node = self._client.get_node_from_key(keys[0])
        return self._node.acquire_connection()

    async def _relearn_slots(self) -> None:
        """On a cluster, after a failed round: the master may be gone."""
        if self._cluster:
            with contextlib.suppress(Exception):
                await self._client.nodes_manager.initialize()

    def _drop_connection(self) -> None:
        """The connection, whose round was cut short, closed in a task of
        its own (a cancelled leader awaits nothing more)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            chore = self.loop.create_task(self._discard(conn))
            self._chores.add(chore)
            chore.add_done_callback(self._chores.discard)

    async def _discard(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            await conn.disconnect()
        await self._give_back(conn)

    async def _release_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._give_back(conn)

    async def _give_back(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            if self._cluster:
                _give_to_node(self._node, conn)
            else:
                await self._client.connection_pool.release(conn)


def _give_to_node(node: Any, conn: Any) -> None:
    """A connection taken with ``node.acquire_connection()``, given back."""
    release = getattr(node, "release", None)
    if release is not None:
        release(conn)
    else:  # redis-py < 5.1: the node keeps its free connections itself
        node._free.append(conn)


async def _get_connection(pool: Any) -> Any:
    """A connection of the client's own pool (redis-py < 5.3 wants a command name)."""
    named = _NAMED.get(type(pool))
    if named is None:
        wants = inspect.signature(pool.get_connection).parameters.get("command_name")
        named = _NAMED[type(pool)] = wants is not None and wants.default is wants.empty
    return await (pool.get_connection("EVALSHA") if named else pool.get_connection())


#: Per connection pool class: whether its get_connection wants a command name.
_NAMED: dict[type, bool] = {}


_REGISTRY: weakref.WeakKeyDictionary[Any, dict[tuple[int, int | None], Reader]] = (
    weakref.WeakKeyDictionary()
)


def readers_of(client: Any) -> list[Reader]:
    """The readers ``client`` has in the running event loop (none are made)."""
    loop = asyncio.get_running_loop()
    return [reader for reader in _REGISTRY.get(client, {}).values() if reader.loop is loop]


def reader_for(client: Any, pool: Pool) -> Reader:
    """The reader of ``client`` in the running event loop (of a cluster
    client: for the pool's slot), made on first use."""
    loop = asyncio.get_running_loop()
    where = (id(loop), pool.slot if is_cluster(client) else None)
    readers = _REGISTRY.setdefault(client, {})
    reader = readers.get(where)
    if reader is None or reader.loop is not loop:
        reader = readers[where] = Reader(client, loop, pool.keys[0])
    return reader


# -- the ends still to deliver ------------------------------------------------


class Sender:
    """Same as the sync shell's sender, for one client and event loop: a
    task that carries out :meth:`Ends.sending
    <allocator._core.pending.Ends.sending>` while ends wait, and ends when
    none is left."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._client = client
        self._scripts = scripts()
        self.ends = Ends()
        self._task: asyncio.Task[None] | None = None

    def take(self, step: Defer | Settle | Pending) -> bool:
        """Same as the sync sender's."""
        reply = self.ends.apply(step)
        if self.ends.waiting and (self._task is None or self._task.done()):
            self._task = self.loop.create_task(self._run())
        return reply

    async def _run(self) -> None:
        flow = self.ends.sending(time.monotonic)
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration:
                return
            reply, error = None, None
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                continue
            try:
                reply = await run_step(self._client, self._scripts, step, None)
            except Exception as exc:  # handed to the flow, which decides
                error = exc

    async def close(self, wait: float = CLOSE_WAIT) -> int:
        """Same as the sync sender's: up to ``wait`` seconds for the ends to
        be delivered, then what is left is dropped and the task ends."""
        task = self._task
        if task is None or task.done():
            return 0
        await asyncio.wait({task}, timeout=wait)
        dropped = len(self.ends.drop_all())
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=TRY)
        return dropped


_SENDERS: weakref.WeakKeyDictionary[Any, dict[int, Sender]] = weakref.WeakKeyDictionary()


def sender_for(client: Any) -> Sender:
    """The sender of ``client`` in the running event loop, made on first use."""
    loop = asyncio.get_running_loop()
    senders = _SENDERS.setdefault(client, {})
    sender = senders.get(id(loop))
    if sender is None or sender.loop is not loop:
        sender = senders[id(loop)] = Sender(client, loop)
    return sender


def senders_of(client: Any) -> list[Sender]:
    """The sender ``client`` has in the running event loop, if any."""
    sender = _SENDERS.get(client, {}).get(id(asyncio.get_running_loop()))
    return [] if sender is None or sender.loop is not asyncio.get_running_loop() else [sender]
