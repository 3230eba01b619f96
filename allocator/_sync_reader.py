"""The reader of a client, blocking: :class:`Reader` carries out the
rounds its core decides (:class:`allocator._core.reader.Reader`) with the
client's waiting threads in turn (:mod:`allocator._core.lead`), on one
connection of the client's, and keeps the client's presence with its watch
(:mod:`allocator._core.presence`), a thread on the presence connection
(:class:`allocator._presence.Presence`). The steps of the flows, and the
connections with a deadline, are :mod:`allocator._sync_io`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core import presence as watching
from ._core import reader as core
from ._core.lead import (
    LEAD,
    PARTIAL,
    THREAD,
    THREAD_LINGER,
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
from ._presence import Presence, refused
from ._scripts import scripts
from ._sync_io import _connection, drive, read_replies, run_call, run_step, sender_for
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
    """The one blocking reader of a Redis client in this process (of a
    cluster client: per hash slot, since one blocking read can only wait on
    keys of one slot), for every pool whose waiters use that client: it
    carries out the rounds of its core (:class:`allocator._core.reader.Reader`)
    on one connection of the client's, which it holds while anyone waits.

    The waiter reads its own grant: the first waiting thread leads the
    rounds, the others follow, and a daemon thread, ``allocator-reader``,
    only sends what nobody is left to acknowledge
    (:mod:`allocator._core.lead` decides who does what). A process with one
    waiting thread, a worker's common case, gets its grant with no thread
    hop.
    """

    def __init__(self, client: Any, key: str) -> None:
        self._client = client
        self._scripts = scripts()
        self._cluster = is_cluster(client)
        self.core = core.Reader(reader_heartbeat(client))
        self._lock = threading.Lock()
        self.lead = Lead(self.core)
        #: The reader's own thread (see _run), while it lives.
        self._thread: threading.Thread | None = None
        #: Asks the thread (under the lock): when it is due to look for
        #: rounds that nobody carried, whether it waits to be asked, and
        #: whether it ends once it has nothing left to do (finish()).
        self._asked = threading.Condition(self._lock)
        self._thread_due: float | None = None
        self._thread_parked = False
        self._retire = False
        self._conn: Any = None
        #: The connection pool ``_conn`` came from: the client's, or on a
        #: cluster that of the master of the reader's slot.
        self._conn_pool: Any = None
        self._closing = False
        self.presence = Presence(client, key) if keeps_presence(client) else None
        #: The leases held through this client, for the presence watch
        #: (:mod:`allocator._core.presence`), and the watch's thread.
        self.holds = Holds()
        self._watcher: threading.Thread | None = None
        self._unwatch = threading.Event()
        #: The presence's generation when the last heartbeat was sent.
        self._beat_generation = 0
        #: Whether the server has BLMPOP (one command a round), until it
        #: refuses it. Not fakeredis: its BLMPOP leaves an emptied list
        #: behind as a key.
        self._multipop = not in_process(client)
        #: Its reclaim_on_disconnect leases, released once the watch gives them up.
        self.reclaimable = Reclaimable()

    @property
    def cid(self) -> str:
        return self.core.cid

    def cid_for(self, pool: Pool, budget: float = RETRY_BUDGET) -> str:
        """The client's id in ``pool``, its presence there set up first if
        it is not yet (:meth:`join`)."""
        self.join(pool, budget)
        return self.known_cid(pool)

    def known_cid(self, pool: Pool) -> str:
        """The client's id in ``pool`` as things stand (no I/O)."""
        with self._lock:
            return self.core.presences.cid_for(pool)

    def joined(self, pool: Pool) -> bool:
        """Whether the client's presence in ``pool`` is decided (no I/O)."""
        with self._lock:
            return self.core.presences.decided(pool)

    def join(self, pool: Pool, budget: float) -> None:
        """Before the client's first wait in ``pool``: set up its presence
        there (one round trip, once per pool and process, within ``budget``
        seconds), a subscription to the pool's presence channel."""
        if self.joined(pool):
            return
        channel = self.core.presences.channel(pool)
        kept = False if self.presence is None else self.presence.join(channel, budget)
        if kept is not None:  # None: the server was out of reach; next time
            with self._lock:
                self.core.presences.decide(pool, kept)

    # -- what the client holds: the presence watch -----------------------------

    def hold(self, pool: Pool, leases: list[Lease]) -> None:
        """Leases granted in ``pool``: while any is held, the watch keeps
        the client's presence (where it keeps one there)."""
        if self.presence is None:
            return
        now = time.monotonic()
        with self._lock:
            if not self.core.presences.kept(pool):
                return
            for lease in leases:
                self.holds.hold(lease.id, now, lease.ttl, pool.reclaim_on_disconnect)
                if pool.reclaim_on_disconnect:
                    self.reclaimable.hold(pool.name, pool.keys, lease, now)
            self._ensure_watch()

    def _ensure_watch(self) -> None:
        """Start the presence watch if it is not running. Under the lock."""
        if self._watcher is None:
            self._unwatch.clear()
            self._watcher = threading.Thread(
                target=self._watch, name="allocator-presence", daemon=True
            )
            self._watcher.start()

    def renewed(self, lease: Lease) -> None:
        with self._lock:
            self.core.claimed(lease.id)
            self.holds.renewed(lease.id, time.monotonic(), lease.ttl)
            self.reclaimable.renewed(lease, time.monotonic())

    def unhold(self, lease: Lease) -> None:
        """``lease`` was released (its release went through)."""
        with self._lock:
            self.core.claimed(lease.id)
            self.holds.drop(lease.id, time.monotonic())
            self.reclaimable.drop(lease.id)

    def lost(self, lease: Lease) -> bool:
        """Whether this process must give ``lease`` up: its presence went
        unconfirmed for longer than the grace while it was held."""
        with self._lock:
            return self.holds.lost(lease.id, time.monotonic())

    def _watch(self) -> None:
        """The presence watch (:func:`allocator._core.presence.watch`), in
        its own thread: each of its decisions under the lock, each of its
        steps outside it."""
        presence = self.presence
        assert presence is not None
        flow = watch(
            self.holds,
            self.core.presences,
            self.reclaimable,
            lambda: self.core.waiting,
            time.monotonic,
            self._unwatch.is_set,  # finish(): idle
        )
        reply: Any = None
        while True:
            with self._lock:
                try:
                    step = flow.send(reply)
                except StopIteration:
                    self._watcher = None
                    return
            reply = self._watch_step(presence, step)

    def _watch_step(self, presence: Presence, step: WatchStep) -> Any:
        """Carry out one step of the presence watch."""
        if isinstance(step, watching.Listen):
            return presence.listen(step.period)
        if isinstance(step, watching.Probe):
            return presence.probe(PROBE_WAIT)
        if isinstance(step, watching.Pause):
            self._unwatch.wait(step.seconds)
        elif isinstance(step, watching.Confirm):
            self._confirm_return()
        elif isinstance(step, watching.GiveUp):
            for release in step.releases:
                sender_for(self._client).take(release)
        else:
            try:
                self._subscribe_again(step.channels)
            except Exception as exc:  # the watch tries again
                _log.debug("allocator: presence not subscribed again yet: %r", exc)
                return refused(self._client, exc)
        return None

    def _subscribe_again(self, channels: list[str], generation: int | None = None) -> None:
        """Subscribe the presence again on a new connection (it broke, or
        the server found it absent: unless ``generation`` is given and a
        new connection was subscribed since), then confirm the return."""
        assert self.presence is not None
        with self._lock:
            if generation is not None and generation != self.presence.generation:
                return
            self.holds.resubscribing()
        self.presence.renew(channels)
        self._confirm_return()

    def _confirm_return(self) -> None:
        """Confirm the client's return in every pool where it keeps a
        presence (lua/present.lua): the absences the scripts found are
        over; until then the presence stays suspended."""
        with self._lock:
            calls = self.core.presences.confirms()
        sent = time.monotonic()
        try:
            answers = [run_call(self._client, self._scripts, call) for call in calls]
        except Exception as exc:  # the watch tries again
            _log.debug("allocator: presence return not confirmed yet: %r", exc)
            return
        if 0 not in answers:
            with self._lock:
                self.holds.returned(sent)

    def register(self, pool: Pool, lid: str) -> None:
        with self._lock:
            self.core.register(pool, lid, queue.SimpleQueue())
            if self.presence is not None and self.core.presences.kept(pool):
                self._ensure_watch()

    def unregister(self, lid: str) -> None:
        with self._lock:
            self.core.unregister(lid)
            self._wake(self.lead.kick())

    def wait(self, lid: str, timeout: float | None) -> Any:
        """The next message for waiter ``lid``, or the reader's trouble
        (None if none) once ``timeout`` seconds have passed. The calling
        thread leads while nobody else does (see the class)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            inbox = self.core.inbox(lid)
        try:
            while True:
                item = take_item(inbox)
                if item is not LEAD:
                    return item
                with self._lock:
                    leads = self.lead.take(lid, inbox, time.monotonic)
                    _READERS.add(self)
                if leads:
                    self._lead(lid, inbox, deadline)
                    if inbox.empty():  # its time ran out, or the rounds ended
                        return self.core.trouble
                    continue
                # A follower, waited in slices: a SIGINT that the kernel
                # hands to another thread of the process only sets Python's
                # flag, and a get that blocks for ever would never return
                # to see it, so the KeyboardInterrupt would not reach this
                # waiter (it would not leave the queue until a message came).
                left = WAIT_SLICE if deadline is None else deadline - time.monotonic()
                try:
                    item = inbox.get(timeout=max(min(WAIT_SLICE, left), 0.0))
                except queue.Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        return self.core.trouble
                    continue
                if item is not LEAD:
                    return item
        finally:
            with self._lock:
                self._wake(self.lead.leave(lid))

    def finish(self) -> None:
        """Unless somebody waits on it: let the reading end (the thread
        that sends what is left to acknowledge, within about a heartbeat),
        give the connection back to the client's pool and close the
        presence."""
        with self._lock:
            thread = None if self.core.waiting else self._thread
            if thread is not None:
                self._retire = True
                self._asked.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.core.heartbeat + READ_SLACK)
        with self._lock:
            if not self.core.waiting and self.lead.leader is None:
                self._release_connection()
            idle = not self.core.waiting and not self.holds.holding
        if self.presence is not None and idle:
            self._unwatch.set()
            self.presence.close()
            with self._lock:
                self.core.forget_presence()

    @property
    def reading(self) -> bool:
        """Rounds are under way (somebody waits, or is left to acknowledge)."""
        return self.lead.reading

    def close_connection(self) -> None:
        """At exit: end the read in flight; the reading then ends quietly."""
        self._closing = True
        conn = self._conn
        if conn is not None:
            conn.disconnect()

    # -- the lead -------------------------------------------------------------

    def _lead(self, me: Any, inbox: Any, deadline: float | None) -> None:
        """Carry out the core's rounds while ``me`` leads
        (:meth:`~allocator._core.lead.Lead.next_step` says until when)."""
        while True:
            with self._lock:
                now = time.monotonic()
                step = None if self._closing else self.lead.next_step(me, inbox, deadline, now)
                if step is None:
                    if not self.lead.reading:  # the rounds ended: nobody waits
                        self._release_connection()
                    return
            try:
                reply = self._carry(step, deadline)
            except BaseException as exc:
                # The connection, a reply perhaps half read, is not used
                # again. A step's own error is handed to the rounds, which
                # decide; anything raised into this thread (a
                # KeyboardInterrupt, a signal handler's exception) goes out
                # with it, and the step is left to the next leader.
                self._drop_connection()
                if not step_error(me, exc):
                    raise
                with self._lock:
                    self.lead.done(None, exc)
            else:
                if reply is not PARTIAL:
                    with self._lock:
                        self.lead.done(reply, None)

    def _wake(self, whom: Any) -> None:
        """Carry out what the lead decided: hand it to a follower (its
        inbox), or ask the reader's thread, which looks ACK_DELAY later.
        Under the lock.

        The thread is started once and then only asked (a notification):
        a waiter on its way out of ``acquire()`` never waits for a thread
        to start, which takes as long as the system takes to schedule it
        (tens of milliseconds on a loaded machine)."""
        if whom is THREAD:
            if self._thread_due is None:
                self._thread_due = time.monotonic() + ACK_DELAY
            if self._thread is None:
                self._retire = False
                self._thread = threading.Thread(
                    target=self._run, name="allocator-reader", daemon=True
                )
                try:
                    self._thread.start()
                except BaseException:
                    self._thread = None  # the next ask starts one again
                    raise
            elif self._thread_parked:
                self._asked.notify()
        elif whom is not None:
            whom.put(LEAD)

    def _run(self) -> None:
        """The reader's thread: leads the rounds that nobody waiting is left
        to carry, ACK_DELAY after it was asked, if nobody waits then."""
        try:
            while self._thread_takes():
                try:
                    self._lead(THREAD, None, None)
                finally:
                    with self._lock:
                        self._wake(self.lead.leave(THREAD))
        finally:
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _thread_takes(self) -> bool:
        """The thread waits until it is due, then takes the lead if nobody
        waits (else it waits to be asked again); False when it ends: not
        asked for THREAD_LINGER, or finish() ended it."""
        with self._lock:
            while True:
                due = self._thread_due
                if due is None:
                    if not self._retire:
                        self._thread_parked = True
                        try:
                            self._asked.wait(THREAD_LINGER)
                        finally:
                            self._thread_parked = False
                    if self._thread_due is None:
                        self._thread = None
                        return False
                    continue
                left = due - time.monotonic()
                if left > 0 and not self._retire:
                    self._asked.wait(left)
                    continue
                self._thread_due = None
                if self.lead.thread_takes():
                    return True

    def _carry(self, step: ReaderStep, deadline: float | None) -> Any:
        """Carry out a step of the core's rounds
        (:meth:`allocator._core.reader.Reader.rounds`), within the leader's
        ``deadline``: a shorter blocking read; a pause cut short is
        :data:`~allocator._core.lead.PARTIAL`, to be finished by the next
        leader."""
        if isinstance(step, Exchange):
            block, wait = self.lead.bounds(step, deadline, time.monotonic())
            return self._exchange(step.acks, step.keys, block, wait)
        if isinstance(step, Beat):
            if self.presence is not None:
                self._beat_generation = self.presence.generation
            return [(key, run_call(self._client, self._scripts, call)) for key, call in step.calls]
        if isinstance(step, Deliver):
            while step.items:  # one by one: an interrupted Deliver is finished, not repeated
                inbox, item = step.items.pop(0)
                inbox.put(item)
            while step.releases:
                drive(retry_single(step.releases[0]), self._run_step)
                step.releases.pop(0)
            return None
        if isinstance(step, Subscribe):
            if self.presence is not None:
                try:
                    self._subscribe_again(step.channels, self._beat_generation)
                except Exception as exc:  # the presence watch tries again
                    _log.debug("allocator: presence not subscribed again yet: %r", exc)
            return None
        seconds, over = self.lead.pause(step.seconds, deadline, time.monotonic())
        time.sleep(seconds)
        return None if over else PARTIAL

    def _run_step(self, step: Step) -> Any:
        return run_step(self._client, self._scripts, step, None)

    def _exchange(
        self, acks: list[tuple[str, list[str]]], keys: list[str], block: float, wait: float
    ) -> list[tuple[Any, Any]]:
        """One round trip: acknowledgements, a blocking pop on ``keys``, then
        what else is on them. Returns the popped ``(key, message)`` pairs.
        On a cluster, the same pipeline goes to the master of the reader's
        slot (all its keys share that slot). One try, as the library's
        calls make (allocator/_transport.py): the client's own retries would
        sleep past the round's bound, and the rounds' pauses decide."""
        with no_client_retries():
            return self._round(acks, keys, block, wait)

    def _round(
        self, acks: list[tuple[str, list[str]]], keys: list[str], block: float, wait: float
    ) -> list[tuple[Any, Any]]:
        conn = self._conn
        if conn is None:
            self._conn_pool = self._round_pool(keys or [pick for pick, _ in acks])
            # Connected (anew after a drop) within the round's own time.
            conn = self._conn = _connection(self._conn_pool, time.monotonic() + wait)
        commands = round_commands(acks, keys, block, self._multipop)
        # The blocking read may last `block`, whatever the client's socket
        # timeout: wait for the reply here (`wait`), then read it.
        try:
            conn.send_packed_command(conn.pack_commands(commands))
            replies = read_replies(conn, len(commands), wait)
        except (RedisConnectionError, RedisTimeoutError):
            if self._cluster:  # the master may be gone: learn the slots again
                with contextlib.suppress(Exception):
                    self._client.nodes_manager.initialize()
            raise
        if self._cluster and moved(replies):
            self._client.nodes_manager.initialize()  # learn the new owner of the slot
        if self._multipop and multipop_refused(commands, replies):
            self._multipop = False  # Redis 6.2: BLPOP rounds from now on
            return self._round(acks, keys, block, wait)
        return round_replies(commands, replies)

    def _round_pool(self, keys: list[str]) -> Any:
        """The connection pool for the reader's rounds: the client's, or the
        pool of the master that serves ``keys`` on a cluster."""
        if not self._cluster:
            return self._client.connection_pool
        return self._client.get_node_from_key(keys[0]).redis_connection.connection_pool

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()
            with contextlib.suppress(Exception):
                self._conn_pool.release(conn)

    def _release_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                self._conn_pool.release(conn)


#: The longest a waiting thread blocks at once (see Reader.wait).
WAIT_SLICE = 0.5

_REGISTRY_LOCK = threading.Lock()
_REGISTRY: weakref.WeakKeyDictionary[Any, dict[tuple[int, int | None], Reader]] = (
    weakref.WeakKeyDictionary()
)


def reader_for(client: Any, pool: Pool) -> Reader:
    """The reader of ``client`` in this process (of a cluster client: for
    the pool's slot), made on first use."""
    where = (os.getpid(), pool.slot if is_cluster(client) else None)
    with _REGISTRY_LOCK:
        readers = _REGISTRY.setdefault(client, {})
        reader = readers.get(where)
        if reader is None:
            reader = readers[where] = Reader(client, pool.keys[0])
        return reader


def readers_of(client: Any) -> list[Reader]:
    """The readers ``client`` has in this process (none are made)."""
    with _REGISTRY_LOCK:
        readers = _REGISTRY.get(client, {})
        return [reader for (pid, _), reader in readers.items() if pid == os.getpid()]


_READERS: weakref.WeakSet[Reader] = weakref.WeakSet()


def _close_readers() -> None:
    """At interpreter exit, a reader's thread (a daemon) may still be about
    to send, or sending, what its last waiter left to acknowledge. Close its
    connection, so that no socket is left open."""
    for reader in list(_READERS):
        if reader.reading:
            with contextlib.suppress(Exception):
                reader.close_connection()


atexit.register(_close_readers)
