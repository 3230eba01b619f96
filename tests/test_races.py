"""The races of a waiter's acquire with a release, a timeout or an interrupt
(docs/concepts.md#guarantees), each staged step by step.

A :class:`~helpers.Stepper` drives a waiter's acquire one step at a time, so
the test can put a release, a timeout or an interrupt exactly between two of
its steps; no sleeps decide the order. The orders that need no server
to tell their outcome are staged on the core alone, in
tests/test_pure_flows.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis
from _workers import server_now
from helpers import Background, Stepper, queued, wait_until

from allocator import AcquireTimeout, AsyncFairAllocator, FairAllocator, Lease
from allocator._core.steps import Call, Wait


@pytest.fixture(params=["redis", "fake"])
def client(request: pytest.FixtureRequest, redis_url_or_none: Any) -> Iterator[Any]:
    if request.param == "redis":
        if redis_url_or_none is None:
            pytest.skip("no real Redis")
        made = redis.Redis.from_url(redis_url_or_none)
    else:
        made = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield made
    made.close()


@pytest.fixture
def redis_url_or_none(request: pytest.FixtureRequest) -> Any:
    try:
        return request.getfixturevalue("redis_url")
    except pytest.skip.Exception:
        return None


@pytest.fixture
def pool(client: Any, pool_name: str) -> FairAllocator:
    return FairAllocator(client, pool_name)


def test_holder_keeps_resource_beyond_internal_timers(pool: FairAllocator, client: Any) -> None:
    """1. A waiter whose reader blocks, times out its reads and polls for
    several heartbeats (and past the pick-up window) never gets in."""
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="waiter queued")
    start = server_now(client)
    wait_until(lambda: server_now(client) > start + 3.5, what="3.5 s of server time")
    assert not waiter.done
    status = pool.status()
    assert (status.leased, status.waiting) == (1, 1)
    pool.release(held)
    assert waiter.join().token > held.token


def test_timeout_racing_a_grant_passes_it_on(pool: FairAllocator) -> None:
    """3. The grant was pushed, then the waiter's timeout fired."""
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    first, second = Stepper(pool), Stepper(pool)
    queued(first)
    queued(second)
    pool.release(held)  # grants `first` and pushes to its list
    cancel = first.throw(AcquireTimeout(pool.name, 1.0))
    assert isinstance(cancel, Call) and cancel.script == "cancel"
    with pytest.raises(AcquireTimeout):
        first.run_step()
    # The raced grant went on to `second` in the same script run.
    second.run_step()
    assert second.done and second.value.resource == "r"
    status = pool.status()
    assert (status.leased, status.waiting) == (1, 0)
    assert pool.release(second.value)
    assert pool.status().free == 1


@pytest.mark.parametrize("at", ["before-enqueue", "after-enqueue-ran", "waiting", "polling"])
def test_interrupt_at_every_step_leaves_nothing_behind(pool: FairAllocator, at: str) -> None:
    """4. KeyboardInterrupt at each step: no orphan ticket, nothing stuck."""
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Stepper(pool)
    if at == "after-enqueue-ran":
        # The script ran on the server but its reply never arrived.
        pool._step(waiter.step)
    elif at in ("waiting", "polling"):
        queued(waiter)
        if at == "polling":
            waiter.nudge()
            waiter.run_step()
            assert isinstance(waiter.step, Call) and waiter.step.script == "poll"
    cancel = waiter.throw(KeyboardInterrupt())
    assert isinstance(cancel, Call) and cancel.script == "cancel"
    with pytest.raises(KeyboardInterrupt):
        waiter.run_step()
    assert pool.status().waiting == 0
    pool.release(held)
    assert pool.status().free == 1
    assert pool.acquire(blocking=False) is not None


def test_stale_signals_are_rechecked_not_trusted(pool: FairAllocator, client: Any) -> None:
    """5. Messages from an earlier round never count as a grant; junk on the
    list is ignored, and a grant naming another waiter releases nothing."""
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Stepper(pool)
    queued(waiter)
    key = pool._pool.signal_key(pool._reader().cid_for(pool._pool))
    lid = waiter.flow.lid
    client.rpush(key, "garbage")
    client.rpush(key, f"g|someone-else|{held.ticket}|5|1|1000|r")
    client.rpush(key, f"g|{lid}|1-1|5|1|1000|r")  # a grant of this waiter's, for another ticket
    waiter.run_step()
    assert not waiter.done and isinstance(waiter.step, Wait)
    status = pool.status()
    assert (status.leased, status.waiting) == (1, 1)
    assert pool.renew(held).token == held.token  # the stray message released nothing
    pool.release(held)
    waiter.run_step()
    assert waiter.done and waiter.value.resource == "r"


def test_a_grant_popped_late_by_the_reader_is_not_released_under_its_holder(
    pool: FairAllocator, client: Any
) -> None:
    """5. The reader pops a grant message, but before it routes it, the
    waiter is handed the same lease by a poll and leaves. The late message
    must not release the lease its owner now holds."""
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Stepper(pool)
    queued(waiter)  # enqueued; its reader has not started yet
    pool.release(held)  # grants the waiter: a message on its client's list
    key = pool._pool.signal_key(pool._reader().cid_for(pool._pool))
    message = client.lpop(key)  # a reader that popped it and then stalled
    assert message is not None
    waiter.nudge()
    waiter.run_step()  # the waiter looks again ...
    assert isinstance(waiter.step, Call) and waiter.step.script == "poll"
    waiter.run_step()  # ... and is handed its lease in the poll's reply
    assert waiter.done and waiter.value.resource == "r"
    reader = pool._reader()
    reader.unregister(waiter.flow.lid)
    # The stalled reader routes it now: no waiter, so it asks for a release,
    # which must find the lease claimed.
    inbox, _, release = reader.core.route(key, message, time.monotonic())
    assert inbox is None and release is not None
    assert pool._drive(pool._pool._single(release)) == [b"claimed"]
    assert pool.status().leased == 1
    assert pool.release(waiter.value) is True


def test_idle_pool_release_racing_arrival(pool: FairAllocator) -> None:
    """6. Release with an empty queue racing a new arrival: both end well."""
    pool.extend(["r"])
    for _ in range(20):
        held = pool.acquire(timeout=5)
        barrier = threading.Barrier(2)

        def release(lease: Lease = held, barrier: threading.Barrier = barrier) -> bool:
            barrier.wait()
            return pool.release(lease)

        def arrive(barrier: threading.Barrier = barrier) -> Lease:
            barrier.wait()
            return pool.acquire(timeout=10)

        r, a = Background(release), Background(arrive)
        assert r.join() is True
        got = a.join()
        assert got.token > held.token
        assert pool.release(got)
    status = pool.status()
    assert (status.free, status.waiting, status.leased) == (1, 0, 0)


def test_retried_acquire_keeps_its_place(pool: FairAllocator) -> None:
    """8. The enqueue ran but its reply was lost; the retry finds the ticket."""
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Stepper(pool)
    enqueue = waiter.step
    lost = enqueue.parse(pool._step(enqueue))  # ran, but the reply was "lost"
    retried = pool._step(enqueue)  # the client sends it again
    again = enqueue.parse(retried)
    assert isinstance(lost, tuple) and isinstance(again, tuple)
    assert again[0] == lost[0]  # the same ticket: still queued, in its place
    assert lost[1] is not None and again[1] is not None  # both told when to look
    waiter._advance(retried)
    assert isinstance(waiter.step, Wait)
    assert pool.status().waiting == 1
    later = Stepper(pool)
    queued(later)
    pool.release(held)
    waiter.run_step()
    assert waiter.done, "the retried waiter kept its place at the head"
    assert pool.status().waiting == 1


def test_retried_release_is_not_applied_twice(pool: FairAllocator) -> None:
    """8. A release applied twice hands off once and bumps nothing twice."""
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    a, b = Stepper(pool), Stepper(pool)
    queued(a)
    queued(b)
    assert pool.release(held) is True
    assert pool.release(held) is False
    a.run_step()
    assert a.done
    assert not b.done and pool.status().waiting == 1 and pool.status().leased == 1


def test_threads_sharing_one_allocator_never_share_a_lease(pool: FairAllocator) -> None:
    """9. Many threads on one allocator object; a counter checks exclusion."""
    pool.extend(["a", "b"])
    inside = {"a": 0, "b": 0}
    worst = {"a": 0, "b": 0}
    lock = threading.Lock()
    ids: list[str] = []

    def work() -> None:
        for _ in range(15):
            lease = pool.acquire(timeout=30)
            with lock:
                inside[lease.resource] += 1
                worst[lease.resource] = max(worst[lease.resource], inside[lease.resource])
                ids.append(lease.id)
            with lock:
                inside[lease.resource] -= 1
            assert pool.release(lease)

    workers = [Background(work) for _ in range(6)]
    for w in workers:
        w.join(60)
    assert worst == {"a": 1, "b": 1} or max(worst.values()) == 1
    assert len(ids) == len(set(ids)) == 90


def test_bad_input_changes_nothing(pool: FairAllocator) -> None:
    """10. Validation happens before the first write."""
    with pytest.raises(TypeError):
        pool.extend(["a", 5])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        pool.extend(["a", "b\nc"])
    assert pool.status().size == 0


# -- asyncio: cancellation at each await ---------------------------------------


@pytest.fixture(params=["redis", "fake"])
def new_async_client(request: pytest.FixtureRequest) -> Callable[[], Any]:
    """Makes an asyncio client on the real server or on a fakeredis server
    (called inside the test's event loop)."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        return lambda: redis.asyncio.Redis.from_url(url)
    server = fakeredis.FakeServer()
    return lambda: fakeredis.FakeAsyncRedis(server=server)


def test_async_cancellation_leaves_nothing_behind(
    new_async_client: Callable[[], Any], pool_name: str
) -> None:
    async def scenario() -> None:
        client = new_async_client()
        apool = AsyncFairAllocator(client, pool_name)
        await apool.extend(["r"])
        held = await apool.acquire(timeout=5)
        # Cancel at successive points: before the first await completes,
        # while it queues, as it starts to wait and lead the rounds, and
        # while queued. Without a timeout, so that a cancellation swallowed
        # on the way (redis-py finishes a command a cancellation interrupted
        # and returns its reply) would leave the acquire waiting for ever:
        # the guard's TimeoutError, not the CancelledError.
        for spins in range(24):
            task = asyncio.ensure_future(apool.acquire(timeout=None))
            for _ in range(spins):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 60)
            assert (await apool.status()).waiting == 0
        # Queued for sure, then cancelled: still nothing left.
        task = asyncio.ensure_future(apool.acquire(timeout=30))
        while (await apool.status()).waiting == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await apool.status()).waiting == 0
        assert await apool.release(held)
        assert (await apool.status()).free == 1
        await client.aclose()

    asyncio.run(scenario())


def test_async_grant_to_departed_waiter_is_passed_on(
    new_async_client: Callable[[], Any], pool_name: str
) -> None:
    """A grant that reaches the router after its waiter left (here: a ticket
    queued on the router's list with no local waiter at all) is released by
    the router, and the next waiter is served without waiting out the
    pick-up window."""

    async def scenario() -> None:
        client = new_async_client()
        apool = AsyncFairAllocator(client, pool_name)
        await apool.extend(["r"])
        held = await apool.acquire(timeout=5)
        cid = await apool._reader().cid_for(apool._pool)
        ghost = apool._pool.acquire(None, None, None, True, cid=cid)
        enqueue = ghost.steps.send(None)
        state = enqueue.parse(await apool._step(enqueue))
        assert isinstance(state, tuple)  # queued, at the head, never registered
        waiter = asyncio.ensure_future(apool.acquire(timeout=30))
        while (await apool.status()).waiting < 2:
            await asyncio.sleep(0.005)
        await apool.release(held)
        got = await waiter
        assert got.resource == "r" and got.token > held.token
        status = await apool.status()
        assert (status.leased, status.waiting) == (1, 0)
        await apool.release(got)
        ghost.steps.close()
        await client.aclose()

    asyncio.run(scenario())
