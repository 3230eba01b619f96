"""Workers and a killer for the tests of presence as a session
(tests/test_presence_session.py): a holder that watches ``lost()``, a
waiter that reports when its acquire returned, and a thread that kills
chosen clients' presence connections at a fixed period.

Times that cross processes are ``time.monotonic()``: one clock for every
process of the machine (CLOCK_MONOTONIC), so that "the holder knew before
the next holder's acquire returned" is a comparison of two readings of it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import redis
import redis.asyncio

from allocator import AsyncFairAllocator, FairAllocator, LeaseLost


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
    never lost, then the end (releasing what it holds)."""
    if aio:
        asyncio.run(_async_watching_holder(url, name, inbox, outbox, client_name, keepalive))
        return
    client = redis.Redis.from_url(url, client_name=client_name)
    pool = FairAllocator(client, name, lease_ttl=6.0, reclaim_on_disconnect=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (inbox.get(), stop.set()), daemon=True).start()
    lost_at: float | None = None
    try:
        with pool.lease(timeout=10, keepalive=keepalive) as lease:
            outbox.put(("granted", lease))
            renewed = time.monotonic()
            while not stop.wait(0.005):
                if lost_at is None and pool.lost(lease):
                    lost_at = time.monotonic()
                    outbox.put(("lost", lost_at))
                if not keepalive and lost_at is None and time.monotonic() - renewed > 0.5:
                    try:
                        lease = pool.renew(lease)
                    except LeaseLost:
                        lost_at = time.monotonic()
                        outbox.put(("lost", lost_at))
                    renewed = time.monotonic()
    except LeaseLost:
        if lost_at is None:
            lost_at = time.monotonic()
            outbox.put(("lost", lost_at))
    outbox.put(("held", lost_at is None))
    client.close()


async def _async_watching_holder(
    url: str, name: str, inbox: Any, outbox: Any, client_name: str, keepalive: bool
) -> None:
    client = redis.asyncio.Redis.from_url(url, client_name=client_name)
    pool = AsyncFairAllocator(client, name, lease_ttl=6.0, reclaim_on_disconnect=True)
    loop = asyncio.get_running_loop()
    stopping = loop.run_in_executor(None, inbox.get)
    lost_at: float | None = None
    try:
        async with pool.lease(timeout=10, keepalive=keepalive) as lease:
            outbox.put(("granted", lease))
            renewed = time.monotonic()
            while not stopping.done():
                await asyncio.sleep(0.005)
                if lost_at is None and pool.lost(lease):
                    lost_at = time.monotonic()
                    outbox.put(("lost", lost_at))
                if not keepalive and lost_at is None and time.monotonic() - renewed > 0.5:
                    try:
                        lease = await pool.renew(lease)
                    except LeaseLost:
                        lost_at = time.monotonic()
                        outbox.put(("lost", lost_at))
                    renewed = time.monotonic()
    except LeaseLost:
        if lost_at is None:
            lost_at = time.monotonic()
            outbox.put(("lost", lost_at))
    outbox.put(("held", lost_at is None))
    await client.aclose()


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
