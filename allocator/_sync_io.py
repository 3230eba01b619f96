"""Blocking I/O for the core's steps: :func:`run_step` carries out one
step (a script call, a confirmed pipeline, a wait, a sleep), :func:`drive`
runs a flow to its end, and :class:`Sender` delivers in the background the
ends a flow could not (:mod:`allocator._core.pending`). A Wait step goes to
the client's reader (:mod:`allocator._sync_reader`).

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

import contextlib
import inspect
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Generator
from typing import Any, Protocol, TypeVar

from redis.connection import Connection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core.pending import CLOSE_WAIT, TRY, Ends
from ._core.reader import (
    READ_SLACK,
)
from ._core.replicas import confirming, moved
from ._core.steps import (
    Call,
    Command,
    Defer,
    Pending,
    Settle,
    Sleep,
    Step,
    Wait,
)
from ._probe import refine
from ._scripts import Scripts, scripts
from ._transport import (
    is_cluster,
    no_client_retries,
    pooled,
)

__all__ = [
    "Sender",
    "Waiting",
    "drive",
    "execute",
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


class Waiting(Protocol):
    """What a Wait step needs of the client's reader
    (:class:`allocator._sync_reader.Reader`)."""

    def wait(self, lid: str, timeout: float | None) -> Any: ...


def run_step(
    client: Any, scripts: Scripts, step: Step, reader: Callable[[], Waiting] | None
) -> Any:
    """Carry out one step of a flow; ``reader`` gives the client's reader
    for a Wait. A connection that a server speaking TLS reset raises
    ``PlainTextToTLS``, which no retry mends (allocator/_probe.py)."""
    try:
        return _run_step(client, scripts, step, reader)
    except RedisConnectionError as exc:
        refined = refine(client, exc)
        if refined is exc:
            raise
        raise refined from exc


def _run_step(
    client: Any, scripts: Scripts, step: Step, reader: Callable[[], Waiting] | None
) -> Any:
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


def _get_connection(pool: Any) -> Any:
    """A connection of the client's own pool (redis-py < 5.3 wants a command name)."""
    named = _NAMED.get(type(pool))
    if named is None:
        wants = inspect.signature(pool.get_connection).parameters.get("command_name")
        named = _NAMED[type(pool)] = wants is not None and wants.default is wants.empty
    return pool.get_connection("EVALSHA") if named else pool.get_connection()


#: Per connection pool class: whether its get_connection wants a command name.
_NAMED: dict[type, bool] = {}


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


_SENDERS_LOCK = threading.Lock()
_SENDERS: weakref.WeakKeyDictionary[Any, dict[int, Sender]] = weakref.WeakKeyDictionary()


def sender_for(client: Any) -> Sender:
    """The sender of ``client`` in this process, made on first use."""
    with _SENDERS_LOCK:
        senders = _SENDERS.setdefault(client, {})
        sender = senders.get(os.getpid())
        if sender is None:
            sender = senders[os.getpid()] = Sender(client)
        return sender


def senders_of(client: Any) -> list[Sender]:
    """The sender ``client`` has in this process, if any (none is made)."""
    with _SENDERS_LOCK:
        sender = _SENDERS.get(client, {}).get(os.getpid())
    return [] if sender is None else [sender]


#: Whether this redis-py reads a reply with its own timeout (newer ones do);
#: older ones wait with can_read first.
_READ_TIMEOUT = "timeout" in inspect.signature(Connection.read_response).parameters


def read_replies(conn: Any, count: int, wait: float) -> list[Any]:
    """``count`` replies from ``conn``, each within ``wait`` seconds (the
    reader's round, whose blocking read may outlast the client's socket
    timeout); error replies as values."""
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
