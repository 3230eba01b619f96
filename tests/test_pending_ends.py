"""Ends that could not be confirmed are delivered later
(docs/concepts.md#ends-still-to-deliver).

A cancel of an acquire that gave up, or a release, that cannot reach the
server is not forgotten: the client keeps sending it in the background and
the server gets it as soon as it answers again. So a short stall or
partition costs the pool a few seconds, not a lease's whole ttl:

- an ``acquire(timeout=1)`` during a 2.5 s SIGSTOP of the server: the server
  runs the buffered enqueue after the stall and grants the free resource to
  the ticket of a caller that left; the cancel, sent again, passes it on;
- a release during a ``CLIENT PAUSE`` or a stall of a few seconds rides it
  out and returns True; one that gives up (a partition that drops what it
  sends) reaches the server once the partition heals;
- a ``reclaim_on_disconnect`` holder gives its lease up across a 2.5 s stall
  (its presence went unconfirmed for longer than the grace) and releases it
  on the server as soon as the server answers again.

Every lease here has a ttl of 20 s; the next acquire after the outage must
succeed within 5 s (before these fixes it waited about 19.7 s).
"""

from __future__ import annotations

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
from _proxy import PartitionProxy
from helpers import LoopThread

from allocator import AcquireTimeout, AsyncFairAllocator, FairAllocator, Lease, LeaseLost
from allocator._core.pending import Ends, Reclaimable, cancel_end, release_end, renew_budget
from allocator._core.pool import Pool
from allocator._core.steps import Call, Defer, Pending, Settle, Sleep
from allocator._server import RedisServer

#: Every lease's life: what a leaked resource costs.
TTL = 20.0
#: How long the next acquire may wait: the resource must come back well
#: before the ttl.
NEXT = 5.0
#: How long the server is stopped (SIGSTOP): longer than the 1 s timeout of
#: the acquire and than the presence grace (1 s), shorter than what a
#: release rides out.
STALL = 2.5


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as made:
        yield made


@contextlib.contextmanager
def stopped(url: str) -> Iterator[Callable[[], None]]:
    """The server stopped (it accepts connections and answers nothing) until
    the call it yields, after :data:`STALL` seconds, or the block's end."""
    with redis.Redis.from_url(url) as admin:
        pid = int(admin.info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()

    def resume() -> None:
        time.sleep(max(STALL - (time.monotonic() - began), 0))
        os.kill(pid, signal.SIGCONT)

    try:
        yield resume
    finally:
        os.kill(pid, signal.SIGCONT)


def one_free(url: str, name: str, **kwargs: Any) -> FairAllocator:
    pool = FairAllocator(redis.Redis.from_url(url), name, lease_ttl=TTL, **kwargs)
    pool.extend(["r"])
    return pool


def next_acquire(url: str, name: str) -> tuple[float, Any]:
    """A new client's acquire: (seconds waited, its lease or what it raised)."""
    with redis.Redis.from_url(url) as client:
        pool = FairAllocator(client, name, lease_ttl=TTL)
        started = time.monotonic()
        try:
            lease: Any = pool.acquire(timeout=NEXT)
        except AcquireTimeout as exc:
            return time.monotonic() - started, exc
        waited = time.monotonic() - started
        pool.release(lease)
        pool.close()
        return waited, lease


def next_acquire_of(url: str, name: str) -> Callable[[], tuple[float, Any]]:
    return lambda: next_acquire(url, name)


def side_by_side(calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each call in a thread of its own; what each returned or raised."""
    got: dict[str, Any] = {}

    def run(name: str, call: Callable[[], Any]) -> None:
        try:
            got[name] = call()
        except BaseException as exc:  # judged by the test
            got[name] = exc

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return got


@pytest.mark.real_redis
def test_a_stall_leaks_nothing_for_a_ttl(server: RedisServer, pool_name: str) -> None:
    """Sync and asyncio side by side, through one 2.5 s SIGSTOP: an acquire
    that times out in it, a release behind it, a reclaimable holder."""
    url = server.url
    names = {
        f"{kind}-{case}": f"{pool_name}-{kind}-{case}"
        for kind in ("sync", "async")
        for case in ("acquire", "release", "reclaim")
    }
    pools = {
        key: one_free(url, name, reclaim_on_disconnect=key.endswith("reclaim"))
        for key, name in names.items()
    }
    loop = LoopThread()
    clients: list[Any] = []
    try:
        sync: dict[str, FairAllocator] = {}
        for case in ("acquire", "release", "reclaim"):
            client = redis.Redis.from_url(url)
            clients.append(client)
            sync[case] = FairAllocator(
                client,
                names[f"sync-{case}"],
                lease_ttl=TTL,
                reclaim_on_disconnect=case == "reclaim",
            )

        async def make_async() -> dict[str, AsyncFairAllocator]:
            made = {}
            for case in ("acquire", "release", "reclaim"):
                client = redis.asyncio.Redis.from_url(url)
                clients.append(client)
                made[case] = AsyncFairAllocator(
                    client,
                    names[f"async-{case}"],
                    lease_ttl=TTL,
                    reclaim_on_disconnect=case == "reclaim",
                )
            return made

        aio = loop.run(make_async())
        held = {
            "sync-release": sync["release"].acquire(timeout=5),
            "sync-reclaim": sync["reclaim"].acquire(timeout=5),
            "async-release": loop.run(aio["release"].acquire(timeout=5)),
            "async-reclaim": loop.run(aio["reclaim"].acquire(timeout=5)),
        }
        # The acquiring clients are connected before the stall.
        sync["acquire"].client.ping()
        loop.run(aio["acquire"].client.ping())
        with stopped(url) as resume:
            got = side_by_side(
                {
                    "sync-acquire": lambda: sync["acquire"].acquire(timeout=1),
                    "async-acquire": lambda: loop.run(aio["acquire"].acquire(timeout=1)),
                    "sync-release": lambda: sync["release"].release(held["sync-release"]),
                    "async-release": lambda: loop.run(
                        aio["release"].release(held["async-release"])
                    ),
                    "stall": resume,
                }
            )
        for kind in ("sync", "async"):
            assert isinstance(got[f"{kind}-acquire"], AcquireTimeout), got
        # The stall: the release rode it out.
        assert got["sync-release"] is True, got
        assert got["async-release"] is True, got
        # Every resource is back: the next acquire of each pool gets it.
        waits = side_by_side({key: next_acquire_of(url, name) for key, name in names.items()})
        late = {key: got for key, got in waits.items() if isinstance(got[1], BaseException)}
        assert not late, f"not back within {NEXT} s of the stall: {late}"
        # The reclaimable holders gave their leases up.
        with pytest.raises(LeaseLost):
            sync["reclaim"].renew(held["sync-reclaim"])
        with pytest.raises(LeaseLost):
            loop.run(aio["reclaim"].renew(held["async-reclaim"]))
        for key in ("sync", "async"):
            for case in ("acquire", "release", "reclaim"):
                allocator: Any = sync[case] if key == "sync" else aio[case]
                if key == "sync":
                    allocator.close()
                else:
                    loop.run(allocator.close())
    finally:
        for client in clients:
            if isinstance(client, redis.Redis):
                client.close()
            else:
                loop.run(client.aclose())
        loop.close()
        for pool in pools.values():
            pool.close()
            pool.client.close()


@pytest.mark.real_redis
def test_a_release_rides_out_a_client_pause(redis_url: str, pool_name: str) -> None:
    """``CLIENT PAUSE`` of 2.5 s from another connection: releases and
    renewals, sync and asyncio side by side, wait for it and go through."""
    pools = {kind: one_free(redis_url, f"{pool_name}-{kind}") for kind in ("sync", "async")}
    for pool in pools.values():
        pool.extend(["s"])
    loop = LoopThread()
    aclient = redis.asyncio.Redis.from_url(redis_url)
    try:
        sync = pools["sync"]
        aio = AsyncFairAllocator(aclient, f"{pool_name}-async", lease_ttl=TTL)
        released, renewed = sync.acquire(timeout=5), sync.acquire(timeout=5)
        areleased = loop.run(aio.acquire(timeout=5))
        arenewed = loop.run(aio.acquire(timeout=5))
        with redis.Redis.from_url(redis_url) as admin:
            admin.execute_command("CLIENT", "PAUSE", 2500, "WRITE")
            got = side_by_side(
                {
                    "sync release": lambda: sync.release(released),
                    "sync renew": lambda: sync.renew(renewed),
                    "async release": lambda: loop.run(aio.release(areleased)),
                    "async renew": lambda: loop.run(aio.renew(arenewed)),
                }
            )
        assert got["sync release"] is True and got["async release"] is True, got
        assert got["sync renew"].token == renewed.token, got
        assert got["async renew"].token == arenewed.token, got
        assert sync.release(renewed) and loop.run(aio.release(arenewed))
        loop.run(aio.close())
        sync.close()
    finally:
        loop.run(aclient.aclose())
        loop.close()
        for pool in pools.values():
            pool.client.close()


@pytest.mark.real_redis
def test_a_release_that_gave_up_reaches_the_server_when_it_answers(
    redis_url: str, pool_name: str
) -> None:
    """A partition drops what the release sends for longer than it rides
    out: it raises, and the release, sent again in the background, frees
    the resource as soon as the partition heals."""
    admin = one_free(redis_url, pool_name)
    with PartitionProxy(redis_url) as proxy:
        client = redis.Redis.from_url(proxy.url)
        pool = FairAllocator(client, pool_name, lease_ttl=TTL)
        held = pool.acquire(timeout=5)
        proxy.partition()
        with pytest.raises(redis.RedisError):
            pool.release(held)
        proxy.heal()
        _, got = next_acquire(redis_url, pool_name)
        assert not isinstance(got, BaseException), f"not back within {NEXT} s: {got!r}"
        pool.close()
        client.close()
    admin.client.close()


# -- the decisions, without I/O -------------------------------------------------


def _lease(pool: Pool, lid: str = "l1", ttl: float = 20.0) -> Lease:
    return Lease(
        resource="r", token=1, id=lid, ticket="1-0", expires_at=0.0, ttl=ttl, granted_at=0.0,
        pool=pool.name,
    )  # fmt: skip


def test_core_keeps_merges_settles_and_bounds_the_ends() -> None:
    pool = Pool.create("p", lease_ttl=20, bind_ttl=5, prefix="alloc")
    lease = _lease(pool)
    release = Call("release", pool.keys, (lease.id, lease.ticket, "", ""), lambda r: r)
    ends = Ends()
    assert ends.apply(Defer(release_end(pool.name, release, lease, now=100.0)))
    # The same lease again: one end, the later bound.
    assert ends.apply(Defer(release_end(pool.name, release, lease, now=105.0)))
    assert len(ends) == 1
    key = (pool.keys[0], lease.id)
    assert ends.apply(Pending(key)) and not ends.apply(Pending((pool.keys[0], "other")))
    # An answer to a later release settles it.
    assert ends.apply(Settle(key)) and not ends.waiting and not ends.apply(Settle(key))
    # Sent until delivered; a transport error backs off (at most CAP) first.
    cancel = Call("cancel", pool.keys, ("q1",), lambda r: r)
    ends.apply(Defer(cancel_end(pool.name, pool.keys, cancel, "q1", 20.0, now=100.0)))
    clock = [110.0]
    flow = ends.sending(lambda: clock[0])
    step = next(flow)
    assert isinstance(step, Call) and step.script == "cancel" and step.deadline == 111.0
    step = flow.throw(redis.ConnectionError("refused"))
    assert isinstance(step, Sleep) and 0 <= step.seconds <= 0.5
    step = flow.send(None)
    assert isinstance(step, Call)
    with pytest.raises(StopIteration):
        flow.send(["released"])
    assert not ends.waiting
    # Past the ttl from the hand-over, the server has ended it: dropped.
    ends.apply(Defer(cancel_end(pool.name, pool.keys, cancel, "q2", 20.0, now=100.0)))
    clock[0] = 121.0
    with pytest.raises(StopIteration):
        next(ends.sending(lambda: clock[0]))
    assert not ends.waiting
    # A permanent error (an ACL refusal) drops it at once.
    ends.apply(Defer(cancel_end(pool.name, pool.keys, cancel, "q3", 20.0, now=120.0)))
    flow = ends.sending(lambda: clock[0])
    next(flow)
    with pytest.raises(StopIteration):
        flow.throw(redis.exceptions.NoPermissionError("NOPERM"))
    assert not ends.waiting


def test_core_renews_ride_out_a_pause_but_not_half_the_ttl() -> None:
    assert renew_budget(2.0, 60.0) == 5.0
    assert renew_budget(2.0, 5.0) == 2.5
    assert renew_budget(2.0, 1.0) == 2.0
    assert renew_budget(45.0, 60.0) == 45.0


def test_core_hands_over_each_given_up_lease_once() -> None:
    pool = Pool.create("p", lease_ttl=20, bind_ttl=5, prefix="alloc")
    kept = Reclaimable()
    kept.hold(pool.name, pool.keys, _lease(pool, "a"), now=0.0)
    kept.hold(pool.name, pool.keys, _lease(pool, "b"), now=0.0)
    kept.hold(pool.name, pool.keys, _lease(pool, "c", ttl=1.0), now=0.0)
    handed = kept.given_up(lambda lid: lid != "b", now=2.0)
    # "c" is past its ttl: the server has ended it; "a" is given up.
    assert [step.end.key[1] for step in handed] == ["a"]
    assert handed[0].end.call.script == "release" and handed[0].end.until == 20.0
    assert kept.given_up(lambda lid: True, now=3.0)[0].end.key[1] == "b"
    assert kept.given_up(lambda lid: True, now=4.0) == []


def test_core_renew_of_a_lease_being_released_raises_lease_lost() -> None:
    pool = Pool.create("p", lease_ttl=20, bind_ttl=5, prefix="alloc")
    flow = pool.renew(_lease(pool), None)
    step = next(flow)
    assert step == Pending((pool.keys[0], "l1"))
    with pytest.raises(LeaseLost, match="still being delivered"):
        flow.send(True)
    # A release that gets the server's answer settles any release pending.
    flow = pool.release(_lease(pool), None)
    step = next(flow)
    assert isinstance(step, Call) and step.script == "release"
    assert flow.send(["released"]) == Settle((pool.keys[0], "l1"))
    with pytest.raises(StopIteration) as done:
        flow.send(False)
    assert done.value.value is True
