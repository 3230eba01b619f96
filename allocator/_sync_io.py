"""Blocking I/O for the core's steps: :func:`run_step` carries out one
step (a script call, a confirmed pipeline, a wait, a sleep), :func:`drive`
runs a flow to its end, and :class:`Reader` is the reader of one client,
whose core's rounds (:class:`allocator._core.reader.Reader`) its waiting
threads carry out in turn (:mod:`allocator._core.lead`).

A step's deadline (``Call.deadline``, set by the core) bounds every socket
read of its commands: :func:`execute` runs a command on a connection of the
client's pool whose socket timeout is what is left until then. A connection
whose command failed midway is closed and kept aside (a spare): the next
command with a deadline reconnects it within that deadline, where the pool
would reconnect it under the client's own timeouts (on a hung server, the
handshake would wait the whole socket timeout, or for ever with redis-py
5's default of none); a connection the pool has yet to open (a new client,
one whose connection dropped) is connected the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import os
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from redis.connection import Connection, ConnectionPool
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
    Pending,
    ReaderStep,
    Settle,
    Sleep,
    Step,
    Subscribe,
    Wait,
)
from ._presence import Presence, refused
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
]

_log = logging.getLogger("allocator")

T = TypeVar("T")
S = TypeVar("S")


def run_call(client: Any, scripts: Scripts, call: Call[T]) -> T:
    """Run a script call and parse its reply (no retries: the caller's)."""
    return call.parse(run_step(client, scripts, call, None))


def run_step(client: Any, scripts: Scripts, step: Step, reader: Callable[[], Reader] | None) -> Any:
    """Carry out one step of a flow; ``reader`` gives the client's reader
    for a Wait."""
    if isinstance(step, Call):
        due = step.deadline
        with no_client_retries():
            sent = None
            if step.confirm is None:
                command = scripts.known(client, step.script, step.keys, step.args)
                if command is not None:
                    try:
                        return execute(client, command, due)
                    except ResponseError as exc:
                        sent = (command, exc)
            commands = scripts.invoke(client, step.script, step.keys, step.args, sent)
            if step.confirm is not None:
                send = _send_to_slot if is_cluster(client) else _send_pipelined
                key = step.keys[0]
                return drive(
                    confirming(step, commands),
                    lambda args: (
                        send(client, args, key, due)
                        if isinstance(args, list)
                        else execute(client, args, due)
                    ),
                )
            return drive(commands, lambda args: execute(client, args, due))
    if isinstance(step, Wait):
        assert reader is not None, "a Wait step needs a reader"
        return reader().wait(step.lid, step.timeout)
    if isinstance(step, Command):
        with no_client_retries():
            return execute(client, step.args, step.deadline)
    if isinstance(step, (Defer, Settle, Pending)):
        return sender_for(client).take(step)
    time.sleep(step.seconds)
    return None


def execute(client: Any, args: tuple[Any, ...], due: float | None) -> Any:
    """Run one command on ``client`` and return its parsed reply. With a
    deadline ``due`` (monotonic seconds), its socket reads and writes, and
    the reconnect of a spare, end by then: redis-py's ``TimeoutError`` says
    they ran out. A cluster client, or a single-connection client, picks
    its connection inside redis-py: there the client's own socket timeout
    bounds each read."""
    if due is None or not pooled(client):
        return client.execute_command(*args)
    pool = client.connection_pool
    conn = _connection(pool, due)
    try:
        before = _limit(conn, due)
        conn.send_command(*args)
        reply = client.parse_response(conn, args[0])
    except ResponseError:
        _give_back(pool, conn, before)  # an error reply, read whole: the connection is clean
        raise
    except BaseException:
        _drop(pool, conn)
        raise
    _give_back(pool, conn, before)
    return reply


def _send_pipelined(
    client: Any, commands: list[tuple[Any, ...]], key: str, due: float | None
) -> list[Any]:
    """A confirmed script call (``_core.replicas.confirming``): its commands in one
    pipeline on one connection; the replies, errors as values."""
    return _send_all(client.connection_pool, commands, due)


def _send_to_slot(
    client: Any, commands: list[tuple[Any, ...]], key: str, due: float | None
) -> list[Any]:
    """Same, on a cluster: one connection to the master of the pool's slot
    (WAIT names no key, and must follow the writes on their connection)."""
    node = client.get_node_from_key(key)
    try:
        replies = _send_all(node.redis_connection.connection_pool, commands, due)
    except (RedisConnectionError, RedisTimeoutError):
        # The master may be gone (failed over): learn the slots again,
        # so that the flow's next try goes to the new one.
        with contextlib.suppress(Exception):
            client.nodes_manager.initialize()
        raise
    if moved(replies):
        client.nodes_manager.initialize()  # learn the new owner of the slot
    return replies


def _send_all(pool: Any, commands: list[tuple[Any, ...]], due: float | None) -> list[Any]:
    """``commands`` in one pipeline on one connection of ``pool``, every
    read by ``due`` (None: the client's socket timeout); the replies,
    errors as values."""
    conn = _connection(pool, due)
    try:
        before = _limit(conn, due)
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
    except BaseException:
        _drop(pool, conn)
        raise
    _give_back(pool, conn, before)
    return replies


# -- connections with a deadline ------------------------------------------------

#: What :func:`_limit` returns when it changed nothing.
_UNCHANGED: Any = object()


def _limit(conn: Any, due: float | None) -> Any:
    """Give the socket of ``conn`` what is left until ``due`` as its
    timeout; return the timeout it had (``_UNCHANGED``: no deadline, or no
    real socket, as with fakeredis)."""
    sock = getattr(conn, "_sock", None)
    if due is None or not isinstance(sock, socket.socket):
        return _UNCHANGED
    before = sock.gettimeout()
    sock.settimeout(max(due - time.monotonic(), 0.001))
    return before


def _give_back(pool: Any, conn: Any, before: Any) -> None:
    """A connection whose command went through: its own timeout back, and back to the pool."""
    if before is not _UNCHANGED:
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            sock.settimeout(before)
    pool.release(conn)


#: Connections the library dropped, per pool (see the module's docstring),
#: each with the process it belongs to.
_SPARES: weakref.WeakKeyDictionary[Any, list[tuple[int, Any]]] = weakref.WeakKeyDictionary()
_SPARES_LOCK = threading.Lock()


def _drop(pool: Any, conn: Any) -> None:
    """A connection whose command failed midway (a reply may still come):
    closed, and kept as a spare, out of the pool."""
    with contextlib.suppress(Exception):
        conn.disconnect()
    with _SPARES_LOCK:
        _SPARES.setdefault(pool, []).append((os.getpid(), conn))


def _connection(pool: Any, due: float | None) -> Any:
    """A connected connection for a command due by ``due``: a spare,
    reconnected by then, else one from the pool (connected by the pool, as
    redis-py does). A spare that reconnects shows the server answers
    again: the other spares go back to the pool."""
    spare = _spare(pool) if _SPARES else None
    if spare is None and due is not None:
        spare = _unconnected(pool)
    if spare is None:
        return _get_connection(pool)
    saved = spare.socket_timeout, spare.socket_connect_timeout
    if due is not None:
        # Read when it connects: the handshake (HELLO, AUTH, CLIENT SETINFO)
        # waits no longer than the command may.
        spare.socket_timeout = spare.socket_connect_timeout = max(due - time.monotonic(), 0.001)
    try:
        spare.connect()
    except BaseException:
        _drop(pool, spare)
        raise
    finally:
        spare.socket_timeout, spare.socket_connect_timeout = saved
    sock = getattr(spare, "_sock", None)
    if isinstance(sock, socket.socket):
        sock.settimeout(spare.socket_timeout)  # its own, as the pool's connections have
    with _SPARES_LOCK:
        others = _SPARES.pop(pool, [])
    pid = os.getpid()
    for owner, conn in others:
        if owner == pid:
            with contextlib.suppress(Exception):
                pool.release(conn)
    return spare


def _unconnected(pool: Any) -> Any:
    """The connection ``pool`` would hand out next if it must connect it
    first (a new client, or one whose connection dropped), taken out of the
    pool as its ``get_connection`` does but not connected: the caller
    connects it within its deadline, as a spare. None when the pool's next
    connection is connected already, or the pool is not one whose ways are
    known (redis-py's ``ConnectionPool``, a Sentinel's included; not a
    ``BlockingConnectionPool``, which then connects under the client's own
    timeouts)."""
    if getattr(type(pool), "get_connection", None) is not _POOL_GET:
        return None
    available = getattr(pool, "_available_connections", None)
    in_use = getattr(pool, "_in_use_connections", None)
    lock = getattr(pool, "_lock", None)
    if not isinstance(available, list) or not isinstance(in_use, set) or lock is None:
        return None
    pool._checkpid()
    with lock:
        if available and getattr(available[-1], "_sock", None) is not None:
            return None  # connected: the pool hands it out as it is
        conn = available.pop() if available else pool.make_connection()
        in_use.add(conn)
    return conn


#: How redis-py's own pool hands out a connection (see :func:`_unconnected`).
_POOL_GET = ConnectionPool.get_connection


def _spare(pool: Any) -> Any:
    """A spare of ``pool`` in this process, or None (a spare of the process
    this one was forked from is forgotten: its pool has been reset)."""
    pid = os.getpid()
    with _SPARES_LOCK:
        kept = _SPARES.get(pool)
        while kept:
            owner, conn = kept.pop()
            if owner == pid:
                return conn
        _SPARES.pop(pool, None)
    return None


def drive(steps: Generator[S, Any, T], run: Callable[[S], Any]) -> T:
    """Run a flow to its end. Errors of a step are thrown into the flow,
    which decides (retry, leave the queue, raise)."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            reply = run(step)
        except BaseException as exc:  # handed to the flow, which decides
            error = exc


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
        self.core = core.Reader(heartbeat_for(client) if self._cluster else HEARTBEAT_PRESENT)
        self._lock = threading.Lock()
        self.lead = Lead(self.core)
        self._thread: threading.Thread | None = None
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
            if not self.core.presences.cid_for(pool).startswith(PRESENT):
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
            self.holds.renewed(lease.id, time.monotonic(), lease.ttl)
            self.reclaimable.renewed(lease, time.monotonic())

    def unhold(self, lease: Lease) -> None:
        with self._lock:
            self.holds.drop(lease.id, time.monotonic())
            self.reclaimable.drop(lease.id)

    def _release_given_up(self) -> None:
        """Hand the release of each lease the watch gave up to the client's
        sender: the server may still hold it (allocator/_core/pending.py)."""
        with self._lock:
            now = time.monotonic()
            handed = self.reclaimable.given_up(lambda lid: self.holds.lost(lid, now), now)
        for step in handed:
            sender_for(self._client).take(step)

    def lost(self, lease: Lease) -> bool:
        """Whether this process must give ``lease`` up: its presence went
        unconfirmed for longer than the grace while it was held."""
        with self._lock:
            return self.holds.lost(lease.id, time.monotonic())

    def _watch(self) -> None:
        """The presence watch (:mod:`allocator._core.presence`): listens on
        the presence connection while the client waits or holds, so that a
        drop is met at once and the client subscribes again and confirms
        its return well within the grace; PINGs it while a reclaimable
        lease is held."""
        presence = self.presence
        assert presence is not None
        while True:
            self._release_given_up()
            with self._lock:
                period = self.holds.period(time.monotonic(), self.core.waiting)
                if period is None or self._unwatch.is_set():  # finish(): idle
                    self._watcher = None
                    return
                probing, fresh = self.holds.probing, self.holds.fresh
            if fresh:  # the last confirmation of the return failed
                self._confirm_return()
            heard = presence.listen(period)
            connected = heard is not None
            if heard:  # the ends of leases the server told (Holds.heard)
                with self._lock:
                    self.holds.heard(heard)
            if self._unwatch.is_set():
                continue
            if connected and probing:
                sent = time.monotonic()
                answer = presence.probe(PROBE_WAIT)
                with self._lock:
                    if not self.holds.probed(answer, sent, time.monotonic()):
                        continue
            elif connected:
                continue
            with self._lock:
                channels = self.core.presences.channels()
            if not channels:
                self._unwatch.wait(period)
                continue
            tried = time.monotonic()
            try:
                self._subscribe_again(channels)
            except Exception as exc:  # tried again after a short pause
                _log.debug("allocator: presence not subscribed again yet: %r", exc)
                with self._lock:
                    if refused(self._client, exc):
                        self.holds.refused(tried)
                    pause = self.holds.retry_in()
                self._unwatch.wait(pause)

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
            if self.presence is not None and self.core.presences.cid_for(pool).startswith(PRESENT):
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
        inbox), or start the reader's thread. Under the lock."""
        if whom is THREAD:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="allocator-reader", daemon=True
                )
                self._thread.start()
        elif whom is not None:
            whom.put(LEAD)

    def _run(self) -> None:
        time.sleep(ACK_DELAY)
        with self._lock:
            if not self.lead.thread_takes():
                return  # a waiter leads, or comes to lead
        try:
            self._lead(THREAD, None, None)
        finally:
            with self._lock:
                self._wake(self.lead.leave(THREAD))

    def _carry(self, step: ReaderStep, deadline: float | None) -> Any:
        """Carry out a step of the core's rounds
        (:meth:`allocator._core.reader.Reader.rounds`), within the leader's
        ``deadline``: a shorter blocking read; a pause cut short is
        :data:`~allocator._core.lead.PARTIAL`, to be finished by the next
        leader."""
        if isinstance(step, Exchange):
            now = time.monotonic()
            block = block_for(step, deadline, now)
            return self._exchange(step.acks, step.keys, block, read_wait(block, deadline, now))
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
        slot (all its keys share that slot)."""
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
            replies = self._read(conn, len(commands), wait)
        except (RedisConnectionError, RedisTimeoutError):
            if self._cluster:  # the master may be gone: learn the slots again
                with contextlib.suppress(Exception):
                    self._client.nodes_manager.initialize()
            raise
        if self._cluster and moved(replies):
            self._client.nodes_manager.initialize()  # learn the new owner of the slot
        if self._multipop and multipop_refused(commands, replies):
            self._multipop = False  # Redis 6.2: BLPOP rounds from now on
            return self._exchange(acks, keys, block, wait)
        return round_replies(commands, replies)

    def _round_pool(self, keys: list[str]) -> Any:
        """The connection pool for the reader's rounds: the client's, or the
        pool of the master that serves ``keys`` on a cluster."""
        if not self._cluster:
            return self._client.connection_pool
        return self._client.get_node_from_key(keys[0]).redis_connection.connection_pool

    def _read(self, conn: Any, count: int, wait: float) -> list[Any]:
        """``count`` replies from ``conn``, each within ``wait`` seconds;
        error replies as values."""
        replies: list[Any] = []
        for _ in range(count):
            try:
                if _READ_TIMEOUT:
                    replies.append(conn.read_response(timeout=wait))
                else:
                    if getattr(conn, "_sock", True) is None:  # closed under it
                        raise RedisConnectionError("the reader's connection was closed")
                    if not conn.can_read(timeout=wait):
                        raise RedisTimeoutError("no reply from the server to the reader's round")
                    replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies

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


#: Whether this redis-py reads a reply with its own timeout (newer ones do);
#: older ones wait with can_read first.
_READ_TIMEOUT = "timeout" in inspect.signature(Connection.read_response).parameters


def _get_connection(pool: Any) -> Any:
    """A connection of the client's own pool (redis-py < 5.3 wants a command name)."""
    named = _NAMED.get(type(pool))
    if named is None:
        wants = inspect.signature(pool.get_connection).parameters.get("command_name")
        named = _NAMED[type(pool)] = wants is not None and wants.default is wants.empty
    return pool.get_connection("EVALSHA") if named else pool.get_connection()


#: Per connection pool class: whether its get_connection wants a command name.
_NAMED: dict[type, bool] = {}


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


# -- the ends still to deliver ------------------------------------------------


class Sender:
    """The background sender of one client in this process: a daemon
    thread, ``allocator-ends``, that carries out :meth:`Ends.sending
    <allocator._core.pending.Ends.sending>` while the client has cancels or
    releases still to deliver (allocator/_core/pending.py), and ends when
    none is left."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._scripts = scripts()
        self._lock = threading.Lock()
        self.ends = Ends()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        #: The spare connection it brought (:func:`_bring_spare`).
        self._spare: Any = None

    def take(self, step: Defer | Settle | Pending) -> bool:
        """Carry out a flow's step (:meth:`Ends.apply
        <allocator._core.pending.Ends.apply>`); start the thread if an end
        waits and none runs."""
        with self._lock:
            reply = self.ends.apply(step)
            if self.ends.waiting and self._thread is None:
                self._wake.clear()
                self._thread = threading.Thread(
                    target=self._run, name="allocator-ends", daemon=True
                )
                self._thread.start()
        return reply

    def _run(self) -> None:
        flow = self.ends.sending(time.monotonic)
        reply: Any = None
        error: BaseException | None = None
        while True:
            with self._lock:
                try:
                    step = flow.send(reply) if error is None else flow.throw(error)
                except StopIteration:
                    self._thread = None
                    return
                except BaseException:
                    self._thread = None
                    raise
            reply, error = None, None
            if isinstance(step, Sleep):
                self._wake.wait(step.seconds)  # cut short by close()
                continue
            try:
                if pooled(self._client):
                    self._spare = _bring_spare(self._client.connection_pool, self._spare)
                reply = run_step(self._client, self._scripts, step, None)
            except Exception as exc:  # handed to the flow, which decides
                error = exc

    def close(self, wait: float = CLOSE_WAIT) -> int:
        """Wait up to ``wait`` seconds for the ends to be delivered, then
        drop what is left and let the thread end (within one try). Returns
        how many were dropped."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return 0
        thread.join(wait)
        with self._lock:
            dropped = len(self.ends.drop_all())
            self._wake.set()
        thread.join(TRY + READ_SLACK)
        return dropped


def _bring_spare(pool: Any, mine: Any) -> Any:
    """Before a try of the sender, while connections of this process are
    kept aside as spares (the server stopped answering): a spare of its own
    (``mine``, else one the pool makes, not connected yet), put where the
    try takes it. So the try reconnects within its deadline, and never
    takes the spare that a caller's next try needs: a caller without one
    is connected by the pool, under the client's own timeouts (on a hung
    server, for as long as it hangs). Returns the sender's spare."""
    pid = os.getpid()
    with _SPARES_LOCK:
        kept = _SPARES.get(pool)
        if not kept or not any(owner == pid for owner, _ in kept):
            return mine  # the pool's connections answer: nothing to bring
        for index, (_, conn) in enumerate(kept):
            if conn is mine:
                kept.append(kept.pop(index))  # the next one taken
                return mine
    made = pool.make_connection()
    with _SPARES_LOCK:
        _SPARES.setdefault(pool, []).append((pid, made))
    return made


_SENDERS: weakref.WeakKeyDictionary[Any, dict[int, Sender]] = weakref.WeakKeyDictionary()


def sender_for(client: Any) -> Sender:
    """The sender of ``client`` in this process, made on first use."""
    with _REGISTRY_LOCK:
        senders = _SENDERS.setdefault(client, {})
        sender = senders.get(os.getpid())
        if sender is None:
            sender = senders[os.getpid()] = Sender(client)
        return sender


def senders_of(client: Any) -> list[Sender]:
    """The sender ``client`` has in this process, if any (none is made)."""
    with _REGISTRY_LOCK:
        sender = _SENDERS.get(client, {}).get(os.getpid())
    return [] if sender is None else [sender]
