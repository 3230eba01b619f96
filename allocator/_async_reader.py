"""The reader of a client, asyncio: the same as :mod:`allocator._sync_reader`,
for the tasks of one event loop. :class:`Reader` carries out the rounds its
core decides (:class:`allocator._core.reader.Reader`) with the loop's
waiting tasks in turn (:mod:`allocator._core.lead`), and keeps the client's
presence with its watch (:mod:`allocator._core.presence`), a task on the
presence connection (:class:`allocator._presence.AsyncPresence`). The steps
of the flows are :mod:`allocator._async_io`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from typing import (
    Any,
)

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._async_io import (
    _cancelling,
    _get_connection,
    _give_to_node,
    drive,
    run_call,
    run_step,
    sender_for,
    within,
)
from ._core import presence as watching
from ._core import reader as core
from ._core.lead import (
    LEAD,
    PARTIAL,
    THREAD,
    Lead,
    step_error,
    take_item,
)
from ._core.pending import Reclaimable
from ._core.pool import Pool
from ._core.presence import PROBE_WAIT, Holds, WatchStep, watch
from ._core.reader import (
    ACK_DELAY,
    READ_SLACK,
    multipop_refused,
    round_commands,
    round_replies,
)
from ._core.replicas import moved
from ._core.retry import RETRY_BUDGET, retry_single
from ._core.steps import (
    Beat,
    Deliver,
    Exchange,
    ReaderStep,
    Step,
    Subscribe,
)
from ._presence import AsyncPresence, refused
from ._scripts import scripts
from ._transport import (
    in_process,
    is_cluster,
    keeps_presence,
    no_client_retries,
    reader_heartbeat,
)
from ._values import Lease

__all__ = ["Reader", "reader_for", "readers_of"]

_log = logging.getLogger("allocator")


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
        self.core = core.Reader(reader_heartbeat(client))
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
        task = asyncio.current_task()
        cancels = _cancelling(task)
        channel = self.core.presences.channel(pool)
        kept = False if self.presence is None else await self.presence.join(channel, budget)
        if kept is not None:  # None: the server was out of reach; next time
            self.core.presences.decide(pool, kept)
        if _cancelling(task) > cancels:
            # A cancellation that redis-py swallowed on the way (as drive
            # finds after a step): the acquire that joins ends here, before
            # it queues, instead of waiting on until its timeout.
            raise asyncio.CancelledError()

    # -- what the client holds: the presence watch -----------------------------

    def hold(self, pool: Pool, leases: list[Lease]) -> None:
        """Same as the sync reader's; the watch is a task."""
        if self.presence is None or not self.core.presences.kept(pool):
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
        self.core.claimed(lease.id)
        self.holds.renewed(lease.id, self.loop.time(), lease.ttl)
        self.reclaimable.renewed(lease, self.loop.time())

    def unhold(self, lease: Lease) -> None:
        """``lease`` was released (its release went through)."""
        self.core.claimed(lease.id)
        self.holds.drop(lease.id, self.loop.time())
        self.reclaimable.drop(lease.id)

    def lost(self, lease: Lease) -> bool:
        return self.holds.lost(lease.id, self.loop.time())

    async def _watch(self) -> None:
        """The presence watch (:func:`allocator._core.presence.watch`), as a
        task."""
        presence = self.presence
        assert presence is not None
        flow = watch(
            self.holds,
            self.core.presences,
            self.reclaimable,
            lambda: self.core.waiting,
            self.loop.time,
            lambda: False,  # finish() cancels the task
        )
        reply: Any = None
        while True:
            try:
                step = flow.send(reply)
            except StopIteration:
                return
            reply = await self._watch_step(presence, step)

    async def _watch_step(self, presence: AsyncPresence, step: WatchStep) -> Any:
        """Carry out one step of the presence watch."""
        if isinstance(step, watching.Listen):
            heard = await presence.listen(step.period)
            if _cancelling(asyncio.current_task()):
                # (redis-py's timed read can take a cancellation for its
                # own timeout and return: the watch ends all the same.)
                raise asyncio.CancelledError
            return heard
        if isinstance(step, watching.Probe):
            return await presence.probe(PROBE_WAIT)
        if isinstance(step, watching.Pause):
            await asyncio.sleep(step.seconds)
        elif isinstance(step, watching.Confirm):
            await self._confirm_return()
        elif isinstance(step, watching.GiveUp):
            for release in step.releases:
                sender_for(self._client).take(release)
        else:
            try:
                await self._subscribe_again(step.channels)
            except Exception as exc:  # the watch tries again
                _log.debug("allocator: presence not subscribed again yet: %r", exc)
                return refused(self._client, exc)
        return None

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
        if self.presence is not None and self.core.presences.kept(pool):
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
                # (Not asyncio.wait_for: on Python 3.11 it returns the item
                # when the item and a cancellation land together, and the
                # cancelled waiter would go on to lead the rounds until its
                # timeout. A cancellation here leaves the item in the inbox,
                # and the lead passes on: `finally`.)
                try:
                    async with asyncio.timeout(span):
                        item = await inbox.get()
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
        task = asyncio.current_task()
        cancels = _cancelling(task)
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
                if _cancelling(task) > cancels:
                    # redis-py finished the round that a cancellation
                    # interrupted and returned its replies (as drive finds
                    # after a step): they are handed on, and the cancelled
                    # leader stops here instead of leading until its timeout.
                    raise asyncio.CancelledError()

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
            block, wait = self.lead.bounds(step, deadline, self.loop.time())
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
        the master of the reader's slot), one try."""
        with no_client_retries():
            return await self._round(acks, keys, block, wait)

    async def _round(
        self, acks: list[tuple[str, list[str]]], keys: list[str], block: float, wait: float
    ) -> list[tuple[Any, Any]]:
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
            return await self._round(acks, keys, block, wait)
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
