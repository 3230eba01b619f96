"""Worker processes for the recovery and chaos tests, and the parent's handle on them.

The workers run in processes started with the ``spawn`` method, so that each
one is a separate client of the pool with its own client id and its own
liveness mark, and so that SIGKILL and SIGSTOP hit a real process. Each worker
talks to the test through its own pair of queues (commands in, reports out):
a killed worker can only spoil its own queues, never another's. Workers that
die at random (chaos) share nothing with a lock in it: their stop flag is a
lock-free shared integer, their ledger a file of their own.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue
import random
import signal
import time
from typing import Any

import redis
import redis.cluster

from allocator import AcquireTimeout, FairAllocator, LeaseLost

CTX = multiprocessing.get_context("spawn")


def server_now(client: Any) -> float:
    """The Redis server's clock, in seconds (the clock every deadline is on)."""
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


def _pool(
    url: str, name: str, lease_ttl: float, reclaim: bool = False
) -> tuple[Any, FairAllocator]:
    """A client of ``url`` (``cluster://host:port``: a Redis Cluster client)."""
    if url.startswith("cluster://"):
        client: Any = redis.cluster.RedisCluster.from_url("redis://" + url[len("cluster://") :])
    else:
        client = redis.Redis.from_url(url)
    return client, FairAllocator(client, name, lease_ttl=lease_ttl, reclaim_on_disconnect=reclaim)


# -- workers (run in the child) -------------------------------------------------


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


def _write(ledger: Any, record: dict[str, Any]) -> None:
    ledger.write(json.dumps(record) + "\n")
    ledger.flush()
    os.fsync(ledger.fileno())


def chaos_worker(
    url: str,
    name: str,
    ledger_path: str,
    seed: int,
    stop: Any,
    ttl: float,
    hold: float,
    reclaim: bool = False,
) -> None:
    """Lease, hold, release, again and again, until ``stop.value`` is set.

    Every lease goes into the ledger (an fsync'ed file of this worker's own)
    as it happens, with times read on the server inside the lease: ``begin``
    (start: after acquire returned, and the lease's deadline), ``renew`` (the
    new deadline), ``end`` (end: before release), ``release`` (its result).
    A worker killed at any point leaves a ledger that tells what it held.
    ``reclaim``: the pool's ``reclaim_on_disconnect``.
    """
    client, pool = _pool(url, name, ttl, reclaim)
    rng = random.Random(seed)
    with open(ledger_path, "a", encoding="utf-8") as ledger:
        while not stop.value:
            try:
                lease = pool.acquire(timeout=2.0, ttl=ttl)
            except AcquireTimeout:
                continue
            start = server_now(client)
            _write(ledger, {
                "kind": "begin", "pid": os.getpid(), "resource": lease.resource,
                "token": lease.token, "granted_at": lease.granted_at,
                "expires_at": lease.expires_at, "start": start, "ticket": lease.ticket,
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
                else:
                    _write(ledger, {
                        "kind": "renew", "token": lease.token, "resource": lease.resource,
                        "expires_at": lease.expires_at,
                    })  # fmt: skip
                time.sleep(rng.uniform(0, hold))
            end = server_now(client)
            _write(ledger, {
                "kind": "end", "token": lease.token, "resource": lease.resource, "end": end,
            })  # fmt: skip
            released = pool.release(lease)
            _write(ledger, {
                "kind": "release", "token": lease.token, "resource": lease.resource,
                "released": released,
            })  # fmt: skip


def fault_worker(
    url: str, name: str, ledger_path: str, seed: int, stop: Any, ttl: float, hold: float
) -> None:
    """``chaos_worker``'s loop on a server under faults (tests/test_faults.py).

    The same ledger records, plus ``error`` records: a call that failed with
    a transport error (the server was down longer than a call's retry budget)
    is written down and the loop goes on; if it was a release, the lease's
    deadline bounds it in the ledger. Any other error ends the worker with a
    traceback and a non-zero exit code, which fails the test: a NOSCRIPT
    after a flush or a restart must never reach the caller.
    """
    client, pool = _pool(url, name, ttl)
    rng = random.Random(seed)
    transport = (redis.ConnectionError, redis.TimeoutError)
    with open(ledger_path, "a", encoding="utf-8") as ledger:

        def failed(op: str, exc: BaseException) -> None:
            _write(ledger, {"kind": "error", "op": op, "error": type(exc).__name__})

        def now() -> float:
            while True:
                try:
                    return server_now(client)
                except transport:
                    time.sleep(0.05)

        while not stop.value:
            try:
                lease = pool.acquire(timeout=2.0, ttl=ttl)
            except AcquireTimeout:
                continue
            except transport as exc:
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
                    pass
                except transport as exc:
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
            except transport as exc:
                failed("release", exc)
                continue
            _write(ledger, {
                "kind": "release", "token": lease.token, "resource": lease.resource,
                "released": released,
            })  # fmt: skip


# -- the parent's side ----------------------------------------------------------------


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
