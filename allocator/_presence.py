"""A client's presence (docs/concepts.md#presence-as-a-session): the
connection, one per reader, that a process keeps subscribed to a channel
per pool it waits in, so that the server tells its death (the kernel
closes its sockets) from a stall. The scripts count the channel's subscribers; the decisions (which
id, when to subscribe again) are the reader's (allocator/_core/reader.py). Sync
and asyncio, as the shells use them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core.retry import RETRY_BUDGET, is_transient
from ._transport import is_cluster, is_sentinel, no_client_retries

__all__ = ["AsyncPresence", "Presence"]

_log = logging.getLogger("allocator")


def _failed(channel: str, error: BaseException) -> bool | None:
    """What a failed subscription to ``channel`` decides: nothing yet (None)
    if the server was out of reach or did not answer in time (a transport
    error, or the asyncio shell's own bound on the subscription running
    out), said at debug; no presence there (False) if it refused, said once
    in the log."""
    if is_transient(error) or isinstance(error, TimeoutError):
        _log.debug("allocator: presence on %s not set up yet: %r", channel, error)
        return None
    _log.warning(
        "allocator: no presence on %s (%r): the client's waiters there are "
        "judged by their liveness mark alone, as in 0.2 (docs/operations.md)",
        channel,
        error,
    )
    return False


def _answers(reply: Any, token: str) -> bool:
    """Whether ``reply`` is the answer to the PING ``token``: ``[pong,
    token]`` in a subscribed RESP2 connection, ``token`` in RESP3."""
    items = reply if isinstance(reply, (list, tuple)) else [reply]
    return any((item.decode() if isinstance(item, bytes) else item) == token for item in items)


def _message(reply: Any) -> str | None:
    """The data of a message published on a presence channel, from what
    the connection read: ``[smessage, channel, data]`` (sharded) or
    ``[message, channel, data]``, in RESP2 or RESP3, bytes or str; None for
    anything else (a confirmation, a PING's answer)."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 3:
        return None
    kind, data = reply[0], reply[2]
    if isinstance(kind, bytes):
        kind = kind.decode("ascii", "replace")
    if kind not in ("message", "smessage"):
        return None
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)


def refused(client: Any, error: BaseException) -> bool:
    """Whether ``error`` says that ``client``'s one server refused a
    connection (it was not running): not for a cluster or Sentinel client,
    whose server may have changed (allocator/_core/presence.py)."""
    if is_cluster(client) or is_sentinel(client):
        return False
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Presence:
    """The presence of one reader's client in this process
    (docs/concepts.md#presence-as-a-session): one connection, subscribed to
    the presence channel of each pool the client waits in (sharded channels
    where the server has them: SSUBSCRIBE on Redis >= 7 and Valkey,
    SUBSCRIBE on 6.2). The scripts
    count its subscribers, and the server drops it the moment this process
    dies; what they publish there is the end of a lease of this client's
    (``e|<lease id>``: a revoke, a reclaim, lua/prelude_clients.lua ``P:tell_end``),
    which :meth:`listen` returns.

    On a cluster (a reader per hash slot), the connection goes to the
    master of the reader's slot, ``key``'s, where its scripts count the
    subscribers (a sharded channel lives in its slot): found again at each
    subscription, so that after a failover it goes to the new master."""

    def __init__(self, client: Any, key: str) -> None:
        self._client = client
        self._key = key
        self._pubsub: Any = None
        self._sharded = True
        self._probes = 0
        #: Messages read and not yet returned by listen (read by a probe,
        #: or before the connection broke).
        self._heard: list[str] = []
        self._lock = threading.Lock()
        #: Counts the subscriptions made on new connections: a heartbeat
        #: that found the client absent subscribes again only if none was
        #: made since it was sent (the watch may have done so already).
        self.generation = 0

    def join(self, channel: str, budget: float) -> bool | None:
        """Subscribe to ``channel`` as well, within ``budget`` seconds;
        False (said in the log) if this client cannot keep a presence there
        (an ACL without the channel), None if the server could not be
        reached in time (the caller waits without a presence this time and
        tries again at its next wait). A refusal leaves the connection as it
        was, subscribed to the client's other channels: its presence in the
        other pools goes on."""
        with self._lock:
            try:
                with no_client_retries():
                    self._subscribe([channel], budget)
            except Exception as exc:
                if not isinstance(exc, ResponseError):
                    self._close()  # in an unknown state: what was sent, what came
                return _failed(channel, exc)
            return True

    def renew(self, channels: list[str]) -> None:
        """Subscribe to ``channels`` again on a new connection: the server
        lost the subscription (a restart, a failover, a dropped socket)."""
        with self._lock:
            self._close()
            self.generation += 1
            try:
                with no_client_retries():
                    self._subscribe(channels, RETRY_BUDGET)
            except BaseException:
                self._close()  # no connection rather than one not subscribed
                raise

    def listen(self, wait: float) -> list[str] | None:
        """Wait up to ``wait`` seconds on the presence connection, sending
        nothing: the messages published on its channels (see the class),
        returned as soon as one comes (an empty list: none came, the
        connection is still open); None if there is none or it broke
        meanwhile (then it is closed, and what it read is kept for the next
        call)."""
        with self._lock:
            if self._pubsub is None:
                return None
            heard, self._heard = self._heard, []
            try:
                with no_client_retries():
                    reply = self._pubsub.parse_response(block=False, timeout=0 if heard else wait)
                    while reply is not None:
                        message = _message(reply)
                        if message is not None:
                            heard.append(message)
                        # Then what else is there already, without waiting.
                        reply = self._pubsub.parse_response(block=False, timeout=0)
            except Exception as exc:
                _log.debug("allocator: presence connection lost: %r", exc)
                self._heard = heard
                self._close()
                return None
            return heard

    def probe(self, wait: float) -> bool | None:
        """Send a PING on the presence connection: True if it is answered
        within ``wait`` seconds, False if not yet (the connection is kept:
        a late answer is passed over by the next probe), None if there is no
        connection, or it broke (then it is closed)."""
        with self._lock:
            if self._pubsub is None:
                return None
            self._probes += 1
            token = f"allocator-probe-{self._probes}"
            deadline = time.monotonic() + wait
            try:
                with no_client_retries():
                    self._pubsub.connection.send_command("PING", token)
                    # At least one read, even past the deadline: after a
                    # stall of the whole process the answer is waiting.
                    while True:
                        left = max(deadline - time.monotonic(), 0.0)
                        reply = self._pubsub.parse_response(block=False, timeout=left)
                        if reply is None:
                            return False
                        message = _message(reply)
                        if message is not None:  # for the next listen
                            self._heard.append(message)
                        elif _answers(reply, token):
                            return True
            except Exception as exc:
                _log.debug("allocator: presence connection lost: %r", exc)
                self._close()
                return None

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()

    def _subscribe(self, channels: list[str], budget: float) -> None:
        deadline = time.monotonic() + budget
        if self._pubsub is None:
            self._pubsub = self._new_pubsub(budget)
        if self._sharded:
            try:
                self._pubsub.ssubscribe(*channels)
                self._confirm(len(channels), deadline)
                return
            except ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._sharded = False  # Redis 6.2: plain channels
                self._close()
                self._pubsub = self._new_pubsub(budget)
        self._pubsub.subscribe(*channels)
        self._confirm(len(channels), deadline)

    def _new_pubsub(self, budget: float) -> Any:
        """A PubSub on a connection of its own (not the pool's: nothing is
        read from it but confirmations), whose connect and reads are bounded
        by ``budget``: a hung server costs a waiter no more than that."""
        target = self._client
        if is_cluster(target):
            target = target.get_node_from_key(self._key).redis_connection
        pubsub = target.pubsub()
        pool = target.connection_pool
        conn = pool.connection_class(**pool.connection_kwargs)
        conn.socket_timeout = conn.socket_connect_timeout = budget
        # Connected here, once: through the PubSub, a timed-out handshake
        # would be tried again (redis-py reconnects), doubling the time.
        conn.connect()
        # (Public since redis-py 5.1; 5.0 has it under its private name.)
        register = getattr(conn, "register_connect_callback", None)
        (register or conn._register_connect_callback)(pubsub.on_connect)
        pubsub.connection = conn
        return pubsub

    def _confirm(self, count: int, deadline: float) -> None:
        """Read the server's confirmations (a refusal is raised here) until
        ``deadline`` (monotonic)."""
        while count > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RedisTimeoutError("no confirmation of the presence subscription")
            message = self._pubsub.get_message(timeout=left)
            if message and message.get("type") in ("subscribe", "ssubscribe", b"subscribe"):
                count -= 1


class AsyncPresence:
    """Same as the sync shell's presence (:class:`Presence`), awaitable. On
    a cluster, redis-py's asyncio client has no PubSub of a node (before
    redis-py 8): the connection is made to the master of ``key``'s slot
    through a connection pool of the presence's own, with the node's
    settings, closed with the presence."""

    def __init__(self, client: Any, key: str) -> None:
        self._client = client
        self._key = key
        #: On a cluster, the client of the node the presence is kept on.
        self._node: Any = None
        self._pubsub: Any = None
        self._sharded = True
        self._probes = 0
        self._heard: list[str] = []
        self._lock = asyncio.Lock()
        self.generation = 0

    async def join(self, channel: str, budget: float) -> bool | None:
        async with self._lock:
            try:
                with no_client_retries():
                    async with asyncio.timeout(budget):
                        await self._subscribe([channel], budget)
            except Exception as exc:
                if not isinstance(exc, ResponseError):
                    await self._close()  # as the sync shell's join
                return _failed(channel, exc)
            return True

    async def renew(self, channels: list[str]) -> None:
        async with self._lock:
            await self._close()
            self.generation += 1
            try:
                with no_client_retries():
                    async with asyncio.timeout(RETRY_BUDGET):
                        await self._subscribe(channels, RETRY_BUDGET)
            except BaseException:
                await self._close()
                raise

    async def listen(self, wait: float) -> list[str] | None:
        async with self._lock:
            if self._pubsub is None:
                return None
            heard, self._heard = self._heard, []
            try:
                with no_client_retries():
                    reply = await self._pubsub.parse_response(
                        block=False, timeout=0 if heard else wait
                    )
                    while reply is not None:
                        message = _message(reply)
                        if message is not None:
                            heard.append(message)
                        reply = await self._pubsub.parse_response(block=False, timeout=0)
            except Exception as exc:
                _log.debug("allocator: presence connection lost: %r", exc)
                self._heard = heard
                await self._close()
                return None
            return heard

    async def probe(self, wait: float) -> bool | None:
        async with self._lock:
            if self._pubsub is None:
                return None
            self._probes += 1
            token = f"allocator-probe-{self._probes}"
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            try:
                with no_client_retries():
                    await self._pubsub.connection.send_command("PING", token)
                    while True:
                        left = max(deadline - loop.time(), 0.0)
                        reply = await self._pubsub.parse_response(block=False, timeout=left)
                        if reply is None:
                            return False
                        message = _message(reply)
                        if message is not None:  # for the next listen
                            self._heard.append(message)
                        elif _answers(reply, token):
                            return True
            except Exception as exc:
                _log.debug("allocator: presence connection lost: %r", exc)
                await self._close()
                return None

    async def close(self) -> None:
        async with self._lock:
            await self._close()

    async def _close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await (pubsub.aclose() if hasattr(pubsub, "aclose") else pubsub.close())
        node, self._node = self._node, None
        if node is not None:
            with contextlib.suppress(Exception):
                await node.connection_pool.disconnect()

    def _new_pubsub(self) -> Any:
        """A PubSub of the client's, or on a cluster of the master of the
        presence's slot (found again at each subscription, so that after a
        failover it goes to the new master)."""
        if not is_cluster(self._client):
            return self._client.pubsub()
        import redis.asyncio

        node = self._client.get_node_from_key(self._key)
        pool = redis.asyncio.ConnectionPool(
            connection_class=node.connection_class, max_connections=2, **node.connection_kwargs
        )
        self._node = redis.asyncio.Redis(connection_pool=pool)
        return self._node.pubsub()

    async def _subscribe(self, channels: list[str], budget: float) -> None:
        if self._pubsub is None:
            self._pubsub = self._new_pubsub()
        if self._sharded:
            try:
                if hasattr(self._pubsub, "ssubscribe"):
                    await self._pubsub.ssubscribe(*channels)
                else:
                    # redis-py < 8 has no sharded channels in asyncio: the
                    # command as it is (the PubSub does not know of them,
                    # which nothing here needs: a new connection subscribes
                    # again, not the PubSub).
                    await self._pubsub.execute_command("SSUBSCRIBE", *channels)
                await self._confirm(len(channels), budget)
                return
            except ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._sharded = False
                await self._close()
                self._pubsub = self._new_pubsub()
        await self._pubsub.subscribe(*channels)
        await self._confirm(len(channels), budget)

    async def _confirm(self, count: int, budget: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while count > 0:
            left = deadline - loop.time()
            if left <= 0:
                raise RedisTimeoutError("no confirmation of the presence subscription")
            message = await self._pubsub.get_message(timeout=left)
            if message and message.get("type") in ("subscribe", "ssubscribe", b"subscribe"):
                count -= 1
