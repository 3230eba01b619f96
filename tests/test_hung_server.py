"""Deadlines against a hung server (docs/api.md#errors).

A private redis-server is stopped (SIGSTOP): it accepts connections (the
kernel does) and never answers. Every public call of FairAllocator and
AsyncFairAllocator must then give up within its deadline: the caller's
timeout for ``acquire`` and ``acquire_many`` (plus the short cancel that
leaves the queue), the single-call budget (``RETRY_BUDGET``) for the others,
the longer one of ``release`` and ``renew`` (``RIDE_OUT``: they ride out a
pause of a few seconds).
The error is the documented one: ``AcquireTimeout`` chaining the transport
error, with the true time waited, or the transport timeout itself.

Here the bound is the behaviour under test, so the tests assert on time,
with a generous slack above each deadline (the bug took 5 to 10 s). Every
call runs on a client of its own that was connected before the stop, twice
in a row (the second meets the connection the first had to drop), and all
calls run side by side (threads, or tasks on one event loop), so the wait is
paid once. Then the server runs again (SIGCONT): the commands it finds
buffered run late, and once the liveness window has passed, a ``gc()``
leaves the pool whole (nobody waiting, nothing leased), and it serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from _workers import server_now
from helpers import LoopThread, wait_until

from allocator import AcquireTimeout, AsyncFairAllocator, FairAllocator
from allocator._core.liveness import ALIVE_MS
from allocator._core.pending import RIDE_OUT
from allocator._core.retry import RETRY_BUDGET
from allocator._server import RedisServer

pytestmark = [pytest.mark.real_redis]

#: Above each call's deadline: the cancel of an acquire that gave up, or
#: the eviction-policy check of an admin call (0.15 s each), and a loaded
#: machine (8 test processes on 2 cores once took 0.69 s). The failures
#: these tests catch took 5 s or more (the client's socket timeout).
SLACK = 2.0
#: lua/prelude_defaults.lua PICKUP_MS: a grant nobody picked up is taken back after it.
PICKUP = 2.0
RESOURCES = ["a", "b", "c"]

#: What each call is expected to raise: AcquireTimeout, or redis-py's
#: TimeoutError (the transport error a single call lets through).
Expect = tuple[float, type[BaseException], Callable[[], Any]]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as made:
        yield made


@contextlib.contextmanager
def hung(server: RedisServer) -> Iterator[None]:
    """The server stopped: it accepts connections and answers nothing."""
    with redis.Redis.from_url(server.url) as admin:
        pid = int(admin.info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


#: The allocators of the calls below, on the pool under test and on a
#: scratch pool (for the calls that change a pool's resources).
POOLS = ("a02", "a15", "nb", "many", "rel", "ren", "st", "le", "sts", "gc")
SCRATCH = ("ext", "rem", "q", "bind", "unbind", "del")


def expectations(
    p: dict[str, Any], s: dict[str, Any], held: Any, kept: Any, pools: Callable[[], Any]
) -> dict[str, Expect]:
    """Every public call, by name: (its time budget, what it raises against
    a hung server, the call), on the allocators ``p`` (:data:`POOLS`) and
    ``s`` (:data:`SCRATCH`), sync or asyncio alike (an asyncio one's call
    makes a coroutine); ``pools`` lists the pools."""
    return {
        "acquire(timeout=0.2)": (0.2, AcquireTimeout, lambda: p["a02"].acquire(timeout=0.2, ttl=1)),
        "acquire(timeout=1.5)": (1.5, AcquireTimeout, lambda: p["a15"].acquire(timeout=1.5, ttl=1)),
        "acquire(blocking=False)": (
            RETRY_BUDGET,
            redis.TimeoutError,
            lambda: p["nb"].acquire(blocking=False, ttl=1),
        ),
        "acquire_many(2, timeout=0.2)": (
            0.2,
            AcquireTimeout,
            lambda: p["many"].acquire_many(2, timeout=0.2, ttl=1),
        ),
        "release": (RIDE_OUT, redis.TimeoutError, lambda: p["rel"].release(held)),
        "renew": (RIDE_OUT, redis.TimeoutError, lambda: p["ren"].renew(kept)),
        "status": (RETRY_BUDGET, redis.TimeoutError, p["st"].status),
        "leases": (RETRY_BUDGET, redis.TimeoutError, p["le"].leases),
        "stats": (RETRY_BUDGET, redis.TimeoutError, p["sts"].stats),
        "gc": (RETRY_BUDGET, redis.TimeoutError, p["gc"].gc),
        "extend": (RETRY_BUDGET, redis.TimeoutError, lambda: s["ext"].extend(["x"])),
        "remove": (RETRY_BUDGET, redis.TimeoutError, lambda: s["rem"].remove(["y"])),
        "quarantine": (RETRY_BUDGET, redis.TimeoutError, lambda: s["q"].quarantine("x", 1)),
        "bind": (RETRY_BUDGET, redis.TimeoutError, lambda: s["bind"].bind("n", "x")),
        "unbind": (RETRY_BUDGET, redis.TimeoutError, lambda: s["unbind"].unbind("n")),
        "delete": (RETRY_BUDGET, redis.TimeoutError, s["del"].delete),
        "pools": (RETRY_BUDGET, redis.TimeoutError, pools),
    }


def sync_calls(
    url: str, name: str, held: Any, kept: Any, made: list[Any], fresh: bool = False
) -> dict[str, Expect]:
    """Every public call, each on a client of its own (connected now, or
    ``fresh``: never connected, as a new process's); the allocators go to
    ``made``."""

    def pool(which: str = name) -> FairAllocator:
        client = redis.Redis.from_url(url)
        if not fresh:
            client.ping()
        made.append(FairAllocator(client, which, lease_ttl=30))
        return made[-1]

    scratch = f"{name}-scratch"
    p = {key: pool() for key in POOLS}
    s = {key: pool(scratch) for key in SCRATCH}
    lister = redis.Redis.from_url(url)
    if not fresh:
        lister.ping()
    return expectations(p, s, held, kept, lambda: FairAllocator.pools(lister))


async def async_calls(
    url: str, name: str, held: Any, kept: Any, made: list[Any], fresh: bool = False
) -> dict[str, Expect]:
    """Same as :func:`sync_calls`, for AsyncFairAllocator (coroutine factories)."""

    async def pool(which: str = name) -> AsyncFairAllocator:
        client = redis.asyncio.Redis.from_url(url)
        if not fresh:
            await client.ping()
        made.append(AsyncFairAllocator(client, which, lease_ttl=30))
        return made[-1]

    scratch = f"{name}-scratch"
    p = {key: await pool() for key in POOLS}
    s = {key: await pool(scratch) for key in SCRATCH}
    lister = redis.asyncio.Redis.from_url(url)
    if not fresh:
        await lister.ping()
    return expectations(p, s, held, kept, lambda: AsyncFairAllocator.pools(lister))


#: One try of one call: (seconds it took, what it raised or returned).
Outcome = tuple[float, Any]


def run_sync(calls: dict[str, Expect]) -> dict[str, list[Outcome]]:
    """Each call twice in a row, all calls side by side in threads."""
    got: dict[str, list[Outcome]] = {name: [] for name in calls}

    def run(name: str, call: Callable[[], Any]) -> None:
        for _ in range(2):
            started = time.monotonic()
            try:
                result: Any = call()
            except BaseException as exc:  # kept and judged below
                result = exc
            got[name].append((time.monotonic() - started, result))

    threads = [
        threading.Thread(target=run, args=(name, call), daemon=True)
        for name, (_, _, call) in calls.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return got


async def run_async(calls: dict[str, Expect]) -> dict[str, list[Outcome]]:
    """Same as :func:`run_sync`, as tasks on one event loop."""
    got: dict[str, list[Outcome]] = {name: [] for name in calls}

    async def run(name: str, call: Callable[[], Any]) -> None:
        for _ in range(2):
            started = time.monotonic()
            try:
                result: Any = await call()
            except BaseException as exc:  # kept and judged below
                result = exc
            got[name].append((time.monotonic() - started, result))

    await asyncio.wait_for(
        asyncio.gather(*(run(name, call) for name, (_, _, call) in calls.items())), 60
    )
    return got


def judge(calls: dict[str, Expect], got: dict[str, list[Outcome]]) -> list[str]:
    """What went wrong, one line per try (empty: every call kept its deadline)."""
    wrong = []
    for name, (deadline, error, _) in calls.items():
        for number, (took, result) in enumerate(got[name], 1):
            what = f"{name} #{number}: {took:.2f}s (deadline {deadline}s): {result!r}"
            if len(got[name]) != 2:
                wrong.append(f"{name}: {len(got[name])} tries ended")
            if took > deadline + SLACK:
                wrong.append(f"{what}: too late")
            if not isinstance(result, error):
                wrong.append(f"{what}: expected {error.__name__}")
                continue
            if isinstance(result, AcquireTimeout):
                # The true time: what the caller waited, the cancel included.
                if not (deadline <= result.waited <= took and took - result.waited < SLACK):
                    wrong.append(f"{what}: waited {result.waited:.3f}s")
                if f"{result.waited:.3f}s" not in str(result):
                    wrong.append(f"{what}: the message does not say the time")
                if not isinstance(result.__cause__, redis.TimeoutError):
                    wrong.append(f"{what}: cause {result.__cause__!r}")
    return wrong


def setup(url: str, name: str) -> tuple[redis.Redis, FairAllocator, Any, Any]:
    admin = redis.Redis.from_url(url)
    pool = FairAllocator(admin, name, lease_ttl=30)
    pool.extend(RESOURCES)
    FairAllocator(admin, f"{name}-scratch").extend(["x", "y"])
    held = pool.acquire(timeout=5)  # released while the server is stopped
    kept = pool.acquire(timeout=5)  # renewed while the server is stopped
    return admin, pool, held, kept


def whole_again(admin: redis.Redis, pool: FairAllocator, kept: Any, resumed: float) -> None:
    """After the stop: what the server ran late settles, and the pool is whole."""
    # The server ran the timed-out acquires' enqueues late, after their
    # cancels (which never got through): their tickets and any grant pushed
    # to them end with the liveness mark the enqueue set and one pick-up
    # check; a grant in a reply nobody read ends at its ttl (1 s here).
    settled = resumed + ALIVE_MS / 1000 + PICKUP + 0.5
    wait_until(lambda: server_now(admin) > settled, timeout=30, what="the liveness window")
    pool.gc()
    status = pool.status()
    assert status.waiting == 0, status
    assert {info.token for info in pool.leases()} == {kept.token}, pool.leases()
    assert pool.release(kept)
    status = pool.status()
    assert (status.size, status.free, status.leased, status.waiting) == (3, 3, 0, 0), status
    again = pool.acquire(timeout=5)
    assert pool.release(again)


def test_every_sync_call_keeps_its_deadline(server: RedisServer, pool_name: str) -> None:
    admin, pool, held, kept = setup(server.url, pool_name)
    made: list[FairAllocator] = []
    calls = sync_calls(server.url, pool_name, held, kept, made)
    with hung(server):
        got = run_sync(calls)
    resumed = server_now(admin)
    wrong = judge(calls, got)
    assert not wrong, "\n".join(wrong)
    whole_again(admin, pool, kept, resumed)
    for each in made:
        # Its client works again (a connection dropped in the hang is
        # connected anew), and every connection back in its pool has the
        # client's own socket timeout, not what was left of a deadline.
        each.stats()
        conns = each.client.connection_pool._available_connections
        assert conns, "the connection went back to the pool"
        for conn in conns:
            assert conn._sock is None or conn._sock.gettimeout() == conn.socket_timeout
        each.client.close()
    admin.close()


def test_every_async_call_keeps_its_deadline(server: RedisServer, pool_name: str) -> None:
    admin, pool, held, kept = setup(server.url, pool_name)
    loop = LoopThread()
    try:
        made: list[AsyncFairAllocator] = []
        calls = loop.run(async_calls(server.url, pool_name, held, kept, made))
        with hung(server):
            got = loop.run(run_async(calls), timeout=90)
        resumed = server_now(admin)
        wrong = judge(calls, got)
        assert not wrong, "\n".join(wrong)
        whole_again(admin, pool, kept, resumed)
        for each in made:
            loop.run(each.stats())  # its client works again
            loop.run(each.client.aclose())
    finally:
        loop.close()
    admin.close()


def test_every_call_on_a_client_made_during_the_hang_keeps_its_deadline(
    server: RedisServer, pool_name: str
) -> None:
    """A client that connects afresh (a new process, a reconnect after a
    dropped connection) connects within what is left of its call's
    deadline, handshake included, not under the client's own timeouts
    (before: 10 to 12 s for an acquire with a timeout of 0.2 to 1.5 s, 5 to
    10 s for the other calls, with redis-py 8's socket timeout of 5 s)."""
    admin, pool, held, kept = setup(server.url, pool_name)
    made: list[Any] = []
    loop = LoopThread()
    try:
        with hung(server):
            calls = sync_calls(server.url, pool_name, held, kept, made, fresh=True)
            got = run_sync(calls)
            acalls = loop.run(async_calls(server.url, pool_name, held, kept, made, fresh=True))
            agot = loop.run(run_async(acalls), timeout=90)
        resumed = server_now(admin)
        wrong = judge(calls, got) + [f"async {line}" for line in judge(acalls, agot)]
        assert not wrong, "\n".join(wrong)
        pool.release(held)  # its releases never got past the handshake
        whole_again(admin, pool, kept, resumed)
        for each in made:
            if isinstance(each, AsyncFairAllocator):
                loop.run(each.client.aclose())
            else:
                each.client.close()
    finally:
        loop.close()
    admin.close()


def test_a_waiter_keeps_its_deadline_when_the_server_hangs_under_it(
    server: RedisServer, pool_name: str
) -> None:
    """Waiters queued, one of them leading its client's blocking read, when
    the server stops: each returns within its timeout and the slack, not
    the reader's read slack (5 s) later."""
    admin = redis.Redis.from_url(server.url)
    pool = FairAllocator(admin, pool_name)
    pool.extend(["a"])
    held = pool.acquire(timeout=5)
    timeouts = (1.0, 1.5, 2.5)
    got: dict[float, tuple[float, Any]] = {}
    clients = [redis.Redis.from_url(server.url) for _ in timeouts]

    def wait(client: Any, timeout: float) -> None:
        started = time.monotonic()
        try:
            result: Any = FairAllocator(client, pool_name).acquire(timeout=timeout)
        except BaseException as exc:  # judged below
            result = exc
        got[timeout] = (time.monotonic() - started, result)

    threads = [
        threading.Thread(target=wait, args=(client, timeout), daemon=True)
        for client, timeout in zip(clients, timeouts, strict=True)
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: pool.status().waiting == len(timeouts), what="the waiters queued")
    with hung(server):
        for thread in threads:
            thread.join(30)
    wrong = [
        f"acquire(timeout={timeout}): {took:.2f}s: {result!r}"
        for timeout, (took, result) in sorted(got.items())
        if took > timeout + SLACK or not isinstance(result, AcquireTimeout)
    ]
    assert len(got) == len(timeouts) and not wrong, "\n".join(wrong)
    assert pool.release(held)
    for client in clients:
        client.close()
    admin.close()
