"""The worker processes of the tests, and the parent's handle on them.

Every function here runs in a child process started with the ``spawn``
method (:data:`CTX`), which imports this module by name: each worker is a
top-level function, so that each one is a separate client of the pool with
its own client id, liveness mark and presence, and so that SIGKILL and
SIGSTOP hit a real process. A worker started through :class:`Proc` talks
to the test through its own pair of queues (commands in, reports out,
appended to its arguments): a killed worker can only spoil its own queues,
never another's. Workers that die at random (chaos, faults) share nothing
with a lock in it: their stop flag is a lock-free shared integer, their
ledger a file of their own. The plain workers at the end
(:func:`ordered_waiter`, :func:`hammer`, :func:`rate_client`) are started
with ``CTX.Process`` and get their barrier and result queue as arguments.

Times that cross processes are either the server's (:func:`server_now`,
the clock of every deadline) or ``time.monotonic()``: one clock for every
process of the machine (CLOCK_MONOTONIC), so that "the holder knew before
the next holder's acquire returned" is a comparison of two readings of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import random
import signal
import threading
import time
from typing import Any

import redis
import redis.asyncio
import redis.cluster

from allocator import AcquireTimeout, AsyncFairAllocator, FairAllocator, LeaseLost

CTX = multiprocessing.get_context("spawn")


def server_now(client: Any) -> float:
    """The Redis server's clock, in seconds (the clock every deadline is on)."""
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


def _pool(
    url: str, name: str, lease_ttl: float = 60.0, reclaim: bool = False, tenant: str = ""
) -> tuple[Any, FairAllocator]:
    """A client of ``url`` (``cluster://host:port``: a Redis Cluster client)."""
    if url.startswith("cluster://"):
        client: Any = redis.cluster.RedisCluster.from_url("redis://" + url[len("cluster://") :])
    else:
        client = redis.Redis.from_url(url)
    return client, FairAllocator(
        client, name, lease_ttl=lease_ttl, reclaim_on_disconnect=reclaim, tenant=tenant
    )


def _write(ledger: Any, record: dict[str, Any]) -> None:
    """One record of a ledger, on disk before the worker goes on."""
    ledger.write(json.dumps(record) + "\n")
    ledger.flush()
    os.fsync(ledger.fileno())


# -- one lease at a time ---------------------------------------------------------------


def leaser(
    url: str,
    name: str,
    inbox: Any,
    outbox: Any,
    timeout: float | None = 60.0,
    ttl: float | None = None,
    lease_ttl: float = 60.0,
    wait_go: bool = False,
    reclaim: bool = False,
) -> None:
    """Acquire one lease, report it, then carry out commands on it.

    Reports: ``("ready", pid)`` once started; with ``wait_go``, the worker
    then waits for the command ``"go"`` (so that a test can start processes
    ahead of time and queue them in an order of its choosing), and acquires.
    Then it reports ``("granted",
    lease)`` or ``("timeout", waited)``. Commands: ``"renew"`` ->
    ``("renewed", lease)`` | ``("lost", token)``; ``"release"`` ->
    ``("released", bool)`` (and the worker ends); ``("renew_every", s)``:
    renew every ``s`` seconds until the lease is lost, then report
    ``("lost", token)``, release, and report ``("released", bool)``;
    ``"exit"``: end without releasing. ``reclaim``: the pool's
    ``reclaim_on_disconnect``.
    """
    _client, pool = _pool(url, name, lease_ttl, reclaim)
    outbox.put(("ready", os.getpid()))
    if wait_go:
        assert inbox.get() == "go"
    try:
        lease = pool.acquire(timeout, ttl=ttl)
    except AcquireTimeout as exc:
        outbox.put(("timeout", exc.waited))
        return
    outbox.put(("granted", lease))
    while True:
        command = inbox.get()
        if command == "renew":
            try:
                lease = pool.renew(lease)
            except LeaseLost as lost:
                outbox.put(("lost", lost.token))
            else:
                outbox.put(("renewed", lease))
        elif command == "release":
            outbox.put(("released", pool.release(lease)))
            return
        elif command == "exit":
            return
        elif isinstance(command, tuple) and command[0] == "renew_every":
            while True:
                time.sleep(command[1])
                try:
                    lease = pool.renew(lease)
                except LeaseLost as lost:
                    outbox.put(("lost", lost.token))
                    break
            outbox.put(("released", pool.release(lease)))
            return
        else:
            raise ValueError(f"unknown command {command!r}")


def async_leaser(
    url: str,
    name: str,
    inbox: Any,
    outbox: Any,
    timeout: float | None = 60.0,
    ttl: float | None = None,
    reclaim: bool = False,
) -> None:
    """The asyncio twin of :func:`leaser` (``wait_go`` always on): report
    ``("ready", pid)``, wait for ``"go"``, acquire with an
    AsyncFairAllocator, report ``("granted", lease)`` or ``("timeout",
    waited)``; then ``"release"`` -> ``("released", bool)`` and the end."""
    import asyncio

    import redis.asyncio

    from allocator import AsyncFairAllocator

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(url)
        pool = AsyncFairAllocator(client, name, reclaim_on_disconnect=reclaim)
        loop = asyncio.get_running_loop()
        outbox.put(("ready", os.getpid()))
        assert await loop.run_in_executor(None, inbox.get) == "go"
        try:
            lease = await pool.acquire(timeout, ttl=ttl)
        except AcquireTimeout as exc:
            outbox.put(("timeout", exc.waited))
            return
        outbox.put(("granted", lease))
        assert await loop.run_in_executor(None, inbox.get) == "release"
        outbox.put(("released", await pool.release(lease)))
        await client.aclose()

    asyncio.run(run())


def partitioned_holder(url: str, name: str, inbox: Any, outbox: Any) -> None:
    """Hold a lease with ``reclaim_on_disconnect`` (ttl 5 s) and renew it
    every 0.2 s until ``renew`` raises LeaseLost; transport errors (the
    server out of reach) are let pass. Reports ``("granted", lease)``, then
    ``("gave_up", time.time())``; then ``"release"`` -> ``("released",
    bool)``."""
    _client, pool = _pool(url, name, 60.0, reclaim=True)
    lease = pool.acquire(10, ttl=5)
    outbox.put(("granted", lease))
    while True:
        try:
            lease = pool.renew(lease)
        except LeaseLost:
            outbox.put(("gave_up", time.time()))
            break
        except Exception:  # the server is out of reach: as a keepalive does
            pass
        time.sleep(0.2)
    assert inbox.get() == "release"
    outbox.put(("released", pool.release(lease)))


def interrupted_through_the_reader(url: str, name: str, inbox: Any, outbox: Any) -> None:
    """Wait in ``acquire(timeout=None)``; on the command ``"aim"``, a helper
    thread sends SIGINT to itself, a thread other than the waiter's (as the
    kernel may choose: a process-directed signal goes to any thread; only
    Python's flag is set there, and the main thread must come to look at
    it: the waiter leads the reading, blocked in a socket read, or follows,
    blocked on its inbox). Reports ``("ready", pid)``, then
    ``("interrupted", None)`` once the waiter's KeyboardInterrupt came, or
    ``("granted", lease)``."""
    import threading

    _client, pool = _pool(url, name, 60.0)

    def aim() -> None:
        assert inbox.get() == "aim"
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    threading.Thread(target=aim, daemon=True).start()
    outbox.put(("ready", os.getpid()))
    try:
        lease = pool.acquire(None)
    except KeyboardInterrupt:
        outbox.put(("interrupted", None))
        return
    outbox.put(("granted", lease))


def lease_block(url: str, name: str, inbox: Any, outbox: Any, ttl: float = 60.0) -> None:
    """Hold a lease inside ``with pool.lease()`` until told to leave the block;
    report how the block's exit went: ``("exit", "ok" | "LeaseLost")``."""
    _client, pool = _pool(url, name, 60.0)
    outbox.put(("ready", os.getpid()))
    try:
        with pool.lease(timeout=60, ttl=ttl) as lease:
            outbox.put(("granted", lease))
            inbox.get()
    except LeaseLost:
        outbox.put(("exit", "LeaseLost"))
    else:
        outbox.put(("exit", "ok"))


def lost_watcher(url: str, name: str, inbox: Any, outbox: Any, use_asyncio: bool = False) -> None:
    """Hold a lease in a ``lease(keepalive=True)`` block and look at
    ``pool.lost(lease)`` every ms (as a holder between the steps of a
    request): report ``("granted", lease)``, then ``("lost", time.time())``
    once it turns true, then ``("exit", name of what the block's exit
    raised, or None)``. ``use_asyncio``: the same with an
    AsyncFairAllocator (the loop yields between looks)."""
    if not use_asyncio:
        _client, pool = _pool(url, name, 60.0)
        try:
            with pool.lease(timeout=10, keepalive=True) as lease:
                outbox.put(("granted", lease))
                while not pool.lost(lease):
                    time.sleep(0.001)
                outbox.put(("lost", time.time()))
        except LeaseLost:
            outbox.put(("exit", "LeaseLost"))
            return
        outbox.put(("exit", None))
        return

    import asyncio

    import redis.asyncio

    from allocator import AsyncFairAllocator

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(url)
        pool = AsyncFairAllocator(client, name)
        try:
            async with pool.lease(timeout=10, keepalive=True) as lease:
                outbox.put(("granted", lease))
                while not pool.lost(lease):
                    await asyncio.sleep(0.001)
                outbox.put(("lost", time.time()))
        except LeaseLost:
            outbox.put(("exit", "LeaseLost"))
            return
        outbox.put(("exit", None))

    asyncio.run(run())


def holder_and_waiter(url: str, name: str, inbox: Any, outbox: Any) -> None:
    """Acquire a lease, report ``("holding", lease)``, then wait for a
    second one (the client's reader beats meanwhile) until stopped."""
    _client, pool = _pool(url, name, 60.0)
    lease = pool.acquire(10)
    outbox.put(("holding", lease))
    with contextlib.suppress(AcquireTimeout):
        pool.acquire(120)


def gc_loop(url: str, name: str, inbox: Any, outbox: Any, every: float = 0.1) -> None:
    """Run ``pool.gc()`` every ``every`` seconds until told to stop. Reports
    ``("reclaimed", (count, server time))`` for each run that reclaimed
    something, and at the end ``("stopped", (runs, reclaimed))``."""
    client, pool = _pool(url, name, 60.0)
    runs = reclaimed = 0
    outbox.put(("ready", os.getpid()))
    while True:
        report = pool.gc()
        runs += 1
        reclaimed += report.reclaimed
        if report.reclaimed:
            outbox.put(("reclaimed", (report.reclaimed, server_now(client))))
        try:
            inbox.get(timeout=every)
        except queue.Empty:
            continue
        break
    outbox.put(("stopped", (runs, reclaimed)))


# -- several resources at once (tests/test_many.py) ------------------------------------


def many_leaser(
    url: str,
    name: str,
    count: int,
    inbox: Any,
    outbox: Any,
    timeout: float | None = 60.0,
    ttl: float | None = None,
    wait_go: bool = False,
) -> None:
    """``acquire_many(count)`` once, report, then carry out commands.

    Reports ``("ready", pid)``; with ``wait_go`` it then waits for ``"go"``.
    Then ``("granted", leases)``, ``("timeout", waited)`` or
    ``("interrupted", None)`` (SIGINT while waiting). Commands:
    ``"release"`` -> ``("released", [bool, ...])`` and the worker ends;
    ``"exit"``: end without releasing.
    """
    _client, pool = _pool(url, name)
    outbox.put(("ready", os.getpid()))
    if wait_go:
        assert inbox.get() == "go"
    try:
        leases = pool.acquire_many(count, timeout, ttl=ttl)
    except AcquireTimeout as exc:
        outbox.put(("timeout", exc.waited))
        return
    except KeyboardInterrupt:
        outbox.put(("interrupted", None))
        return
    outbox.put(("granted", leases))
    while True:
        command = inbox.get()
        if command == "release":
            outbox.put(("released", [pool.release(lease) for lease in leases]))
            return
        if command == "exit":
            return
        raise ValueError(f"unknown command {command!r}")


def churner(
    url: str, name: str, count: int, inbox: Any, outbox: Any, expire: float | None = None
) -> None:
    """Acquire ``count`` (``acquire`` for 1), release, again and again, until
    told ``"stop"``; reports ``("round", 1)`` after its first round and
    ``("stopped", rounds)`` at the end. With ``expire`` (a ttl), it never
    releases: its leases end by expiry, all of a grant at once."""
    _client, pool = _pool(url, name)
    rounds = 0
    while True:
        try:
            command = inbox.get_nowait()
        except queue.Empty:
            command = None
        if command == "stop":
            outbox.put(("stopped", rounds))
            return
        try:
            if count == 1:
                leases = [pool.acquire(timeout=5, ttl=expire)]
            else:
                leases = pool.acquire_many(count, 5, ttl=expire)
        except AcquireTimeout:
            continue
        if expire is None:
            for lease in leases:
                pool.release(lease)
        rounds += 1
        if rounds == 1:
            outbox.put(("round", 1))


# -- ledgers of what was held: chaos and faults ----------------------------------------


def chaos_worker(
    url: str,
    name: str,
    ledger_path: str,
    seed: int,
    stop: Any,
    ttl: float,
    hold: float,
    reclaim: bool = False,
    faults: bool = False,
    tenant: str = "",
) -> None:
    """Lease, hold, release, again and again, until ``stop.value`` is set.

    Every lease goes into the ledger (an fsync'ed file of this worker's own)
    as it happens, with times read on the server inside the lease: ``begin``
    (start: after acquire returned, and the lease's deadline), ``renew`` (the
    new deadline), ``end`` (end: before release), ``release`` (its result).
    A worker killed at any point leaves a ledger that tells what it held.
    ``reclaim``: the pool's ``reclaim_on_disconnect``.

    ``faults``: the server is put through faults (:func:`fault_worker`): a
    call that failed with a transport error (the server was down longer
    than a call's retry budget) is written down as an ``error`` record and
    the loop goes on; if it was a release, the lease's deadline bounds it
    in the ledger. Any other error, and without ``faults`` any error at
    all, ends the worker with a traceback and a non-zero exit code.
    ``tenant``: the tenant its requests name (the allocator's default).
    """
    client, pool = _pool(url, name, ttl, reclaim, tenant)
    rng = random.Random(seed)
    passing = (redis.ConnectionError, redis.TimeoutError) if faults else ()
    with open(ledger_path, "a", encoding="utf-8") as ledger:

        def failed(op: str, exc: BaseException) -> None:
            _write(ledger, {"kind": "error", "op": op, "error": type(exc).__name__})

        def now() -> float:
            while True:
                try:
                    return server_now(client)
                except passing:
                    time.sleep(0.05)

        while not stop.value:
            try:
                lease = pool.acquire(timeout=2.0, ttl=ttl)
            except AcquireTimeout:
                continue
            except passing as exc:
                # A grant may have been made whose reply was lost: it is
                # not ours to use; it is released by its waiter's cancel or
                # reclaimed at its deadline, never used by two.
                failed("acquire", exc)
                continue
            _write(ledger, {
                "kind": "begin", "pid": os.getpid(), "resource": lease.resource,
                "token": lease.token, "granted_at": lease.granted_at,
                "expires_at": lease.expires_at, "start": now(), "ticket": lease.ticket,
            })  # fmt: skip
            time.sleep(rng.uniform(0, hold))
            if rng.random() < 0.3:
                try:
                    lease = pool.renew(lease)
                except LeaseLost:
                    # Only if this process stalled past its ttl: the ledger
                    # bounds the lease by its last deadline, and release
                    # below reports False.
                    pass
                except passing as exc:
                    failed("renew", exc)
                else:
                    _write(ledger, {
                        "kind": "renew", "token": lease.token, "resource": lease.resource,
                        "expires_at": lease.expires_at,
                    })  # fmt: skip
                time.sleep(rng.uniform(0, hold))
            _write(ledger, {
                "kind": "end", "token": lease.token, "resource": lease.resource, "end": now(),
            })  # fmt: skip
            try:
                released = pool.release(lease)
            except passing as exc:
                failed("release", exc)
                continue
            _write(ledger, {
                "kind": "release", "token": lease.token, "resource": lease.resource,
                "released": released,
            })  # fmt: skip


def fault_worker(
    url: str, name: str, ledger_path: str, seed: int, stop: Any, ttl: float, hold: float
) -> None:
    """:func:`chaos_worker` on a server under faults (tests/test_faults.py):
    transport errors are written down and the loop goes on; a NOSCRIPT
    after a flush or a restart, or any other error, must never reach the
    caller, and ends the worker with a non-zero exit code."""
    chaos_worker(url, name, ledger_path, seed, stop, ttl, hold, faults=True)


def chaos_many_worker(
    url: str, name: str, ledger_path: str, seed: int, stop: Any, ttl: float, hold: float
) -> None:
    """Like :func:`chaos_worker`, with requests for 1 to 3 resources at
    random (``acquire`` or ``acquire_many``). Every lease of a grant goes in
    the ledger as it happens, fsync'ed: ``begin`` records (one per lease,
    with the grant's ``group``, its ``count``, and the server time ``start``
    read after acquire returned), then per lease ``end`` (before release)
    and ``release`` (its result)."""
    client, pool = _pool(url, name, ttl)
    rng = random.Random(seed)
    group = 0
    with open(ledger_path, "a", encoding="utf-8") as ledger:
        while not stop.value:
            count = rng.choice((1, 1, 2, 3))
            try:
                if count == 1 and rng.random() < 0.5:
                    leases = [pool.acquire(timeout=2.0, ttl=ttl)]
                else:
                    leases = pool.acquire_many(count, timeout=2.0, ttl=ttl)
            except AcquireTimeout:
                continue
            group += 1
            start = server_now(client)
            for lease in leases:
                _write(ledger, {
                    "kind": "begin", "pid": os.getpid(), "group": group, "count": count,
                    "resource": lease.resource, "token": lease.token,
                    "granted_at": lease.granted_at, "expires_at": lease.expires_at,
                    "start": start,
                })  # fmt: skip
            time.sleep(rng.uniform(0, hold))
            if rng.random() < 0.3:
                for i, lease in enumerate(leases):
                    try:
                        leases[i] = pool.renew(lease)
                    except LeaseLost:
                        continue
                    _write(ledger, {
                        "kind": "renew", "token": lease.token, "resource": lease.resource,
                        "expires_at": leases[i].expires_at,
                    })  # fmt: skip
                time.sleep(rng.uniform(0, hold))
            end = server_now(client)
            for lease in leases:
                _write(ledger, {
                    "kind": "end", "token": lease.token, "resource": lease.resource, "end": end,
                })  # fmt: skip
            for lease in leases:
                _write(ledger, {
                    "kind": "release", "token": lease.token, "resource": lease.resource,
                    "released": pool.release(lease),
                })  # fmt: skip


# -- presence as a session (tests/test_presence_session.py) ----------------------------


def watching_holder(
    url: str,
    name: str,
    inbox: Any,
    outbox: Any,
    client_name: str,
    keepalive: bool = True,
    aio: bool = False,
) -> None:
    """Hold a lease acquired with ``reclaim_on_disconnect`` (ttl 6 s), kept
    alive (``keepalive``: the ``lease()`` block's own renewals, else a
    renew every 0.5 s), and look at ``lost()`` every 5 ms. Reports
    ``("granted", lease)``, then ``("lost", monotonic time)`` the first time
    the lease is known lost (``lost()``, or ``LeaseLost`` from a renew or
    the block's exit); on ``"stop"``: ``("held", bool)`` whether it was
    never lost, then the end (releasing what it holds). ``aio``: the same
    with an AsyncFairAllocator."""
    watch = _Watch(outbox, keepalive)
    if aio:
        asyncio.run(_async_watching_holder(url, name, inbox, client_name, keepalive, watch))
        return
    client = redis.Redis.from_url(url, client_name=client_name)
    pool = FairAllocator(client, name, lease_ttl=6.0, reclaim_on_disconnect=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (inbox.get(), stop.set()), daemon=True).start()
    try:
        with pool.lease(timeout=10, keepalive=keepalive) as lease:
            watch.granted(lease)
            while not stop.wait(0.005):
                if watch.looked(pool.lost(lease)):
                    try:
                        lease = pool.renew(lease)
                    except LeaseLost:
                        watch.lost()
                    watch.renewed()
    except LeaseLost:
        watch.lost()
    watch.end()
    client.close()


async def _async_watching_holder(
    url: str, name: str, inbox: Any, client_name: str, keepalive: bool, watch: _Watch
) -> None:
    client = redis.asyncio.Redis.from_url(url, client_name=client_name)
    pool = AsyncFairAllocator(client, name, lease_ttl=6.0, reclaim_on_disconnect=True)
    stopping = asyncio.get_running_loop().run_in_executor(None, inbox.get)
    try:
        async with pool.lease(timeout=10, keepalive=keepalive) as lease:
            watch.granted(lease)
            while not stopping.done():
                await asyncio.sleep(0.005)
                if watch.looked(pool.lost(lease)):
                    try:
                        lease = await pool.renew(lease)
                    except LeaseLost:
                        watch.lost()
                    watch.renewed()
    except LeaseLost:
        watch.lost()
    watch.end()
    await client.aclose()


class _Watch:
    """What the sync and the asyncio :func:`watching_holder` share: the
    reports, the first loss (reported once), and when a renew is due."""

    def __init__(self, outbox: Any, keepalive: bool) -> None:
        self._outbox = outbox
        self._keepalive = keepalive
        self._lost_at: float | None = None
        self._renewed = time.monotonic()

    def granted(self, lease: Any) -> None:
        self._outbox.put(("granted", lease))
        self.renewed()

    def renewed(self) -> None:
        self._renewed = time.monotonic()

    def lost(self) -> None:
        """The lease is known lost: said at once, the first time."""
        if self._lost_at is None:
            self._lost_at = time.monotonic()
            self._outbox.put(("lost", self._lost_at))

    def looked(self, lost: bool) -> bool:
        """``lost()`` said ``lost``: whether the holder renews now (without
        a keepalive, every 0.5 s while the lease is not known lost)."""
        if lost:
            self.lost()
        return (
            not self._keepalive and self._lost_at is None and time.monotonic() - self._renewed > 0.5
        )

    def end(self) -> None:
        self._outbox.put(("held", self._lost_at is None))


def timed_waiter(
    url: str, name: str, inbox: Any, outbox: Any, client_name: str, timeout: float = 60.0
) -> None:
    """Report ``("ready", pid)``, wait for ``"go"``, acquire; report
    ``("granted", (lease, monotonic time the acquire returned))``; on
    ``"release"`` release it, report ``("released", bool)`` and end."""
    client = redis.Redis.from_url(url, client_name=client_name)
    pool = FairAllocator(client, name, lease_ttl=30.0)
    outbox.put(("ready", os.getpid()))
    assert inbox.get() == "go"
    lease = pool.acquire(timeout)
    outbox.put(("granted", (lease, time.monotonic())))
    assert inbox.get() == "release"
    outbox.put(("released", pool.release(lease)))
    client.close()


def crowd(
    url: str, name: str, inbox: Any, outbox: Any, clients: int, waiters: int, timeout: float = 120.0
) -> None:
    """A crowd in one process: ``clients`` asyncio clients (each its own
    reader, client id and presence connection), each with ``waiters``
    tasks waiting in the pool. Reports ``("ready", pid)``; then waits (a
    test kills it: every client dies at once)."""

    async def wait_in(pool: AsyncFairAllocator) -> None:
        await pool.acquire(timeout)

    async def run() -> None:
        made = [redis.asyncio.Redis.from_url(url) for _ in range(clients)]
        pools = [AsyncFairAllocator(client, name) for client in made]
        tasks = [asyncio.create_task(wait_in(pool)) for pool in pools for _ in range(waiters)]
        outbox.put(("ready", os.getpid()))
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())


class Flapper:
    """Takes the presence of the clients that log in as ``user`` down for
    the first ``down`` part of every ``period`` seconds and lets it come
    back for the rest, from a thread of the test process, until stopped:
    the user's channel permissions are revoked (``ACL SETUSER user
    resetchannels``: the server drops its subscribed connections at once,
    and refuses their subscriptions again) and then given back
    (``allchannels``), while every other connection of theirs works on. So
    each absence is shorter than the grace, and the client comes back
    between two: a client whose presence connection drops and returns
    again and again. Counts the down phases."""

    def __init__(self, url: str, user: str, period: float, down: float = 0.5) -> None:
        self._client = redis.Redis.from_url(url, decode_responses=True)
        self._user = user
        self._period = period
        self._down = down * period
        self._stop = threading.Event()
        self.flaps = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flapper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._client.execute_command("ACL", "SETUSER", self._user, "allchannels")
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._client.execute_command("ACL", "SETUSER", self._user, "resetchannels")
            self.flaps += 1
            if self._stop.wait(self._down):
                return
            self._client.execute_command("ACL", "SETUSER", self._user, "allchannels")
            self._stop.wait(self._period - self._down)


def flapped_url(url: str, client: Any, user: str) -> str:
    """``url`` as user ``user`` (made with every permission, for
    :class:`Flapper`)."""
    client.execute_command(
        "ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "allchannels", "+@all"
    )
    host = url.split("://", 1)[1]
    return f"redis://{user}:pw@{host}"


# -- plain processes (tests/test_processes.py, tests/test_features.py) -----------------


def ordered_waiter(url: str, pool: str, me: int, start: Any, results: Any) -> None:
    """Wait for `start`, then acquire once and report (me, ticket, token)."""
    client = redis.Redis.from_url(url)
    alloc = FairAllocator(client, pool)
    start.wait()
    lease = alloc.acquire(timeout=60)
    results.put((me, lease.ticket, lease.token))
    alloc.release(lease)


def hammer(
    url: str, pool: str, me: int, rounds: int, long_every: int, ledger: str, barrier: Any
) -> None:
    """Acquire and release `rounds` times; write every visit to the ledger.

    Inside each lease: INCR a per-resource counter (outside the pool's keys),
    note server times on entry and exit, DECR. The ledger lines are written
    and fsync'ed before release, so the test reads what really happened.
    """
    client = redis.Redis.from_url(url)
    alloc = FairAllocator(client, pool)
    barrier.wait()
    with open(ledger, "a", encoding="utf-8") as out:
        for i in range(rounds):
            lease = alloc.acquire(timeout=120)
            inside = client.incr(f"{pool}:inside:{lease.resource}")
            entered = server_now(client)
            # Most holds are short; some outlast every internal timer of the
            # library (heartbeat 1 s, pick-up window 2 s).
            time.sleep(2.2 if long_every and i % long_every == long_every - 1 else 0.002)
            left = server_now(client)
            client.decr(f"{pool}:inside:{lease.resource}")
            line = {
                "who": me, "resource": lease.resource, "token": lease.token,
                "ticket": lease.ticket, "entered": entered, "left": left,
                "inside": inside, "expires_at": lease.expires_at,
            }  # fmt: skip
            out.write(json.dumps(line) + "\n")
            out.flush()
            os.fsync(out.fileno())
            assert alloc.release(lease), "lease lost while held"


def rate_client(url: str, pool: str, until: float, barrier: Any, results: Any) -> None:
    """Lease the rate-limited key as often as the pool allows until server
    time `until`; report each grant's server time."""
    client = redis.Redis.from_url(url)
    alloc = FairAllocator(client, pool)
    barrier.wait()
    granted = []
    while True:
        lease = alloc.acquire(timeout=30)
        granted.append(lease.granted_at)
        alloc.release(lease)
        if lease.granted_at >= until:
            break
    results.put(granted)


# -- the parent's side -----------------------------------------------------------------


def _traced(target: Any, *args: Any, **kwargs: Any) -> None:
    """Run a worker with SIGUSR1 set to print every thread's stack, and
    SIGINT raising KeyboardInterrupt as in a program started from a shell.
    (Deep in a full run, workers were seen to start with SIGINT ignored, as
    Python leaves it when its parent had it ignored at exec: a SIGINT test's
    worker then never saw the signal.)"""
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    target(*args, **kwargs)


class Proc:
    """A worker process with its own command and report queues."""

    def __init__(self, target: Any, *args: Any, **kwargs: Any) -> None:
        self.inbox = CTX.Queue()
        self.outbox = CTX.Queue()
        self.process = CTX.Process(
            target=_traced,
            args=(target, *args, self.inbox, self.outbox),
            kwargs=kwargs,
            daemon=True,
        )
        self.process.start()
        self.pid: int = self.process.pid  # type: ignore[assignment]

    def dump(self) -> None:
        """Have a live worker print every thread's stack to its stderr (the
        test's captured output), to show where it hangs."""
        if self.process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGUSR1)
            time.sleep(0.5)

    def expect(self, kind: str, timeout: float = 30.0) -> Any:
        """The next report, which must be of ``kind``; returns its payload."""
        try:
            got, payload = self.outbox.get(timeout=timeout)
        except queue.Empty:
            self.dump()
            raise AssertionError(
                f"worker {self.pid} sent no {kind!r} report within {timeout} s "
                f"(alive: {self.process.is_alive()})"
            ) from None
        assert got == kind, f"worker {self.pid}: expected {kind!r}, got {(got, payload)!r}"
        return payload

    def expect_each(self, kinds: tuple[str, ...], timeout: float = 30.0) -> dict[str, Any]:
        """The next reports, one of each of ``kinds`` in any order (two
        threads of a worker report them); their payloads by kind."""
        got: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(kinds):
            try:
                kind, payload = self.outbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.dump()
                raise AssertionError(
                    f"worker {self.pid} sent {sorted(got)} of {sorted(kinds)} within {timeout} s "
                    f"(alive: {self.process.is_alive()})"
                ) from None
            assert kind in kinds and kind not in got, (
                f"worker {self.pid}: expected one of each of {kinds!r}, got {(kind, payload)!r}"
            )
            got[kind] = payload
        return got

    def until(self, kind: str, timeout: float = 30.0) -> Any:
        """Skip reports until one of ``kind``; returns its payload."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got, payload = self.outbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"worker {self.pid} sent no {kind!r} report") from None
            if got == kind:
                return payload

    def poll(self) -> tuple[str, Any] | None:
        """The next report if there is one now, else None."""
        try:
            message: tuple[str, Any] = self.outbox.get_nowait()
        except queue.Empty:
            return None
        return message

    def send(self, command: Any) -> None:
        self.inbox.put(command)

    def kill(self) -> None:
        """SIGKILL, and reap the process."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.process.join(10)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def join(self, timeout: float = 30.0) -> int:
        self.process.join(timeout)
        assert not self.process.is_alive(), f"worker {self.pid} did not end within {timeout} s"
        code: int = self.process.exitcode  # type: ignore[assignment]
        return code

    def close(self) -> None:
        """Make sure the process is gone (test teardown)."""
        if self.process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
            self.kill()
        for q in (self.inbox, self.outbox):
            q.close()
            q.cancel_join_thread()


def first_report(procs: list[Proc], kind: str, timeout: float) -> tuple[Proc, Any]:
    """Wait for the first of ``procs`` to report ``kind`` (any other report fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            message = proc.poll()
            if message is not None:
                assert message[0] == kind, f"worker {proc.pid}: expected {kind!r}, got {message!r}"
                return proc, message[1]
        time.sleep(0.005)
    raise AssertionError(f"none of {[p.pid for p in procs]} reported {kind!r} within {timeout} s")
