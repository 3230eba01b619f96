"""Small tools shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from harness import RECHECK, Call, Defer, Pending, Run, Settle, Sleep, Wait

from allocator import (
    AsyncFairAllocator,
    FairAllocator,
    _async_io,
    _async_reader,
    _sync_io,
    _sync_reader,
)
from allocator._core.presence import Holds


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Wait for a condition on shared state (not for time to pass)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.005)


def ticket_key(ticket: str) -> tuple[int, int]:
    ms, seq = ticket.split("-")
    return int(ms), int(seq)


class Background:
    """Run a call in a thread; keep its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 20.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "background call did not finish"
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


#: Every Stepper made by the running test; conftest closes them after it.
_STEPPERS: list[Stepper] = []


def close_steppers() -> None:
    while _STEPPERS:
        _STEPPERS.pop().close()


def end_presence_watches() -> None:
    """Forget what every reader of this process holds, so that its presence
    watch ends: a test that ends with leases held, perhaps on a server it
    stopped, must not leave a watch probing (and reconnecting) into the
    next test."""
    for registry in (_sync_reader._REGISTRY, _async_reader._REGISTRY):
        for readers in list(registry.values()):
            for reader in list(readers.values()):
                reader.holds = Holds()
                if isinstance(reader, _sync_reader.Reader):
                    watcher = reader._watcher
                    reader._unwatch.set()
                    if watcher is not None:
                        watcher.join(5)


def end_pending_ends() -> None:
    """Drop what every sender of this process still has to deliver, so that
    its thread or task ends: a test whose server is gone must not leave one
    retrying into the next test."""
    for senders in list(_sync_io._SENDERS.values()):
        for sender in list(senders.values()):
            sender.close(wait=0)
    for asenders in list(_async_io._SENDERS.values()):
        for asender in list(asenders.values()):
            asender.ends.drop_all()


class Stepper(Run):
    """Drives an acquire flow of a sync FairAllocator one step at a time,
    each step carried out for real (:meth:`run_step`), so a test can put
    other events between any two steps (tests/harness.py's :class:`Run`,
    on a real server). It is registered with the allocator's reader like a
    real acquire."""

    def __init__(self, pool: FairAllocator, **kwargs: Any) -> None:
        self.pool = pool
        self.reader = pool._reader()
        self.flow = pool._pool.acquire(
            kwargs.get("timeout"),
            kwargs.get("ttl"),
            kwargs.get("bind"),
            kwargs.get("blocking", True),
            cid=self.reader.cid_for(pool._pool),
        )
        self.reader.register(pool._pool, self.flow.lid)
        _STEPPERS.append(self)
        super().__init__(self.flow.steps, lid=self.flow.lid)

    def ended(self) -> None:
        """The flow is over, as the shell's acquire would be: it leaves the reader."""
        self.reader.unregister(self.flow.lid)

    def close(self) -> None:
        """Leave the reader, as the shell does when an acquire returns: a
        flow left half-way must not keep the reader waiting for it after
        its test (a later test counts the server's blocked readers)."""
        self.flow.steps.close()
        self.reader.unregister(self.flow.lid)

    def run_step(self) -> Any:
        """Carry out the current step for real and move to the next."""
        step = self.step
        if isinstance(step, (Call, Wait, Defer, Settle, Pending)):
            return self.reply(self.pool._step(step))
        assert isinstance(step, Sleep)
        return self.reply(None)

    def nudge(self) -> None:
        """Have the reader ask this waiter to look again (as after a data loss)."""
        self.reader.core.inbox(self.flow.lid).put(RECHECK)


def queued(stepper: Stepper) -> None:
    """Run the enqueue; the waiter must now be queued and about to wait."""
    assert isinstance(stepper.step, Call) and stepper.step.script == "acquire"
    stepper.run_step()
    assert isinstance(stepper.step, Wait), stepper.step


# -- an event loop in a thread, to drive async allocators from sync tests ---


class LoopThread:
    """An event loop in a daemon thread. What the loop reports to its
    exception handler (a task that died with nobody awaiting it, such as an
    allocator's router) is kept in ``errors``, not logged: logging would
    format a traceback from inside the garbage collector."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[str] = []
        self.loop.set_exception_handler(
            lambda loop, context: self.errors.append(
                f"{context.get('message')}: {context.get('exception')!r} "
                f"({context.get('task') or context.get('future')})"
            )
        )
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout: float | None = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def drain(self) -> None:
        """Cancel every task still on the loop (an allocator's router)."""

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(drain())

    def close(self) -> None:
        self.drain()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncView:
    """An AsyncFairAllocator seen through FairAllocator's blocking API."""

    def __init__(self, apool: AsyncFairAllocator, loop: LoopThread) -> None:
        self.inner = apool
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if inspect.iscoroutinefunction(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._loop.run(attr(*args, **kwargs))

            return call
        return attr

    @contextlib.contextmanager
    def lease(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with self._enter(self.inner.lease(*args, **kwargs)) as held:
            yield held

    @contextlib.contextmanager
    def lease_many(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with self._enter(self.inner.lease_many(*args, **kwargs)) as held:
            yield held

    @contextlib.contextmanager
    def _enter(self, manager: Any) -> Iterator[Any]:
        held = self._loop.run(manager.__aenter__())
        try:
            yield held
        except BaseException as exc:
            if not self._loop.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._loop.run(manager.__aexit__(None, None, None))


def readers_quiet(*pools: Any, timeout: float = 10.0) -> None:
    """Until the readers of these (sync) allocators have ended, within a
    heartbeat of their last waiter: a test whose servers stop at its end
    waits for this, so that no reader outlives them and retries its last
    acknowledgement against a server that is gone (logging warnings into
    later tests)."""
    from allocator._sync_reader import reader_for

    readers = [reader_for(pool.client, pool._pool) for pool in pools]
    wait_until(lambda: not any(r.reading for r in readers), timeout, "the readers to end")


def blocked_readers(client: Any) -> int:
    """Clients blocked in a reader's round right now (BLMPOP, or BLPOP on
    Redis 6.2: a reader waiting on its list), of those that connected since
    ``client`` did (connection ids grow): a reader of an earlier test on the
    same server, which lingers a few seconds after its last waiter, is not
    one of this test's."""
    pool = client.connection_pool
    mine = set()
    for conn in [*pool._available_connections, *pool._in_use_connections]:
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            host, port = sock.getsockname()[:2]
            mine.add(f"{host}:{port}")
    listed = client.client_list()
    first = min((int(c["id"]) for c in listed if c["addr"] in mine), default=0)
    return sum(
        1
        for c in listed
        if int(c["id"]) >= first and c.get("cmd") in ("blpop", "blmpop") and "b" in c["flags"]
    )
