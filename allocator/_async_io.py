"""Asyncio I/O for the core's steps: the same as :mod:`allocator._sync_io`,
awaitable. A Wait step goes to the client's reader in the running event
loop (:mod:`allocator._async_reader`).

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
from typing import Any, Protocol, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core.pending import CLOSE_WAIT, TRY, Ends
from ._core.replicas import confirming, moved
from ._core.retry import reset_by_peer
from ._core.steps import (
    Call,
    Command,
    Defer,
    Flow,
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
    "within",
]

_log = logging.getLogger("allocator")

T = TypeVar("T")


async def run_call(client: Any, scripts: Scripts, call: Call[T]) -> T:
    """Run a script call and parse its reply (no retries: the caller's)."""
    return call.parse(await run_step(client, scripts, call, None))


class Waiting(Protocol):
    """What a Wait step needs of the client's reader
    (:class:`allocator._async_reader.Reader`)."""

    async def wait(self, lid: str, timeout: float | None) -> Any: ...


async def run_step(
    client: Any, scripts: Scripts, step: Step, reader: Callable[[], Waiting] | None
) -> Any:
    """Same as the sync shell's ``run_step``, awaitable (the probe of a
    reset connection runs in a thread)."""
    try:
        return await _run_step(client, scripts, step, reader)
    except RedisConnectionError as exc:
        if not reset_by_peer(exc):
            raise
        refined = await asyncio.to_thread(refine, client, exc)
        if refined is exc:
            raise
        raise refined from exc


async def _run_step(
    client: Any, scripts: Scripts, step: Step, reader: Callable[[], Waiting] | None
) -> Any:
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
