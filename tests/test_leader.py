"""The waiter reads its own grant (docs/performance.md): leader and followers.

While threads (or tasks) of one client wait, there is no reader thread:
the first waiter leads, carrying out the rounds on the client's one
blocking connection, and the others follow, each woken by the message the
leader routes to it. When the leader's own message comes, or its time runs
out, the lead passes to the follower that has waited longest. What the last
waiter leaves to acknowledge goes with the next waiter's round, or with the
reader's thread, which never leads while anyone waits.

Each test can fail: with a reader thread, the first sees it; a lead that is
not handed on strands the followers (their grants are never read); an
acknowledgement left unsent leaves the grant in the pool's pick-up set.
(The lead's decisions alone, without a server: tests/test_pure_flows.py.)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from helpers import blocked_readers, wait_until

from allocator import AcquireTimeout, AsyncFairAllocator, FairAllocator, Lease
from allocator._core.keys import PICK
from allocator._sync_reader import Reader, reader_for


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    made = redis.Redis.from_url(redis_url, decode_responses=True)
    yield made
    made.close()


@pytest.fixture
def thread_leads(monkeypatch: pytest.MonkeyPatch, client: Any) -> list[bool]:
    """Each time the thread of ``client``'s reader took the lead: whether
    anyone waited. (Not another reader's: one of an earlier test may still
    be lingering in this process.)"""
    seen: list[bool] = []
    lead = Reader._lead

    def counted(self: Reader, me: Any, inbox: Any, deadline: float | None) -> None:
        if inbox is None and self._client is client:
            seen.append(self.core.waiting)
        lead(self, me, inbox, deadline)

    monkeypatch.setattr(Reader, "_lead", counted)
    return seen


def acquire_in_thread(pool: FairAllocator, timeout: float, out: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            out.append(pool.acquire(timeout=timeout))
        except AcquireTimeout as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_lone_waiter_reads_its_own_grant(
    client: Any, pool_name: str, thread_leads: list[bool]
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    got: list[Any] = []
    waiter = acquire_in_thread(pool, 30, got)
    wait_until(lambda: blocked_readers(client) == 1, what="the waiter blocked in its read")
    # (This client's reader has no thread; one of an earlier test's clients
    # may still be lingering in this process.)
    assert reader_for(client, pool._pool)._thread is None

    assert pool.release(held)
    waiter.join(30)
    assert isinstance(got[0], Lease) and got[0].resource == "r"
    pick = pool._pool.keys[PICK]
    wait_until(lambda: client.zcard(pick) == 0, what="the grant acknowledged")
    wait_until(lambda: not reader_for(client, pool._pool).reading, what="the reading ended")
    assert thread_leads == [False]  # only to acknowledge, once nobody waited
    assert pool.release(got[0])


def test_the_lead_passes_to_the_waiter_that_waited_longest(
    client: Any, pool_name: str, thread_leads: list[bool]
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    order: list[int] = []
    done = threading.Event()

    def wait(i: int) -> None:
        lease = pool.acquire(timeout=60)
        order.append(i)
        pool.release(lease)
        if i == 3:
            done.set()

    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=wait, args=(i,), daemon=True))
        threads[-1].start()
        wait_until(lambda n=i + 1: pool.status().waiting == n, what=f"waiter {i} queued")
    assert blocked_readers(client) == 1  # one blocking connection for all four

    assert pool.release(held)
    assert done.wait(60), f"the lead was not passed on: served {order}"
    assert order == [0, 1, 2, 3]
    for thread in threads:
        thread.join(10)
    pick = pool._pool.keys[PICK]
    wait_until(lambda: client.zcard(pick) == 0, what="every grant acknowledged")
    assert True not in thread_leads


def test_a_leader_whose_time_runs_out_hands_the_lead_on(
    client: Any, pool_name: str, thread_leads: list[bool]
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    first: list[Any] = []
    leader = acquire_in_thread(pool, 1.0, first)
    wait_until(lambda: blocked_readers(client) == 1, what="the first waiter leading")
    second: list[Any] = []
    follower = acquire_in_thread(pool, 60, second)
    wait_until(lambda: pool.status().waiting == 2, what="the second waiter queued")

    leader.join(30)
    assert isinstance(first[0], AcquireTimeout)
    assert pool.release(held)
    follower.join(30)
    assert second and isinstance(second[0], Lease), "the follower's grant was never read"
    assert pool.release(second[0])
    assert True not in thread_leads


def test_a_waiter_on_its_way_out_starts_no_thread(
    client: Any, pool_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a waiter leaves to acknowledge is the reader's thread's to send,
    and the thread is started once, then asked: a waiter returning from
    acquire() never waits for a thread to start (on a loaded machine that
    took tens of milliseconds, and delayed the grant's holder as long)."""
    import allocator._sync_reader

    # The thread lingers for the whole test, however slow the machine.
    monkeypatch.setattr(allocator._sync_reader, "THREAD_LINGER", 600.0)
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    reader = reader_for(client, pool._pool)
    pick = pool._pool.keys[PICK]
    starts: list[str] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        # Only this reader's thread: a reader of an earlier test in the same
        # worker process may still be asked to send what it had left.
        mine = getattr(getattr(self, "_target", None), "__self__", None) is reader
        if mine and self.name == "allocator-reader":
            starts.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for turn in range(3):
        held = pool.acquire(timeout=5)
        got: list[Any] = []
        waiter = acquire_in_thread(pool, 30, got)
        wait_until(lambda: blocked_readers(client) == 1, what="the waiter blocked in its read")
        assert pool.release(held)
        waiter.join(30)
        assert isinstance(got[0], Lease)
        # Its grant, still held, is acknowledged by the reader's thread.
        wait_until(lambda: client.zcard(pick) == 0, what=f"grant {turn} acknowledged")
        wait_until(lambda: not reader.reading, what=f"the reading ended after grant {turn}")
        assert pool.release(got[0])
    assert starts == ["allocator-reader"]
    pool.close()
    assert reader._thread is None  # close() ends the thread


def test_a_released_grant_is_not_acknowledged_again(
    redis_url: str, pool_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release claims its grant on the server: a worker that loops
    acquire, release sends no acknowledgement of its own, so each of its
    rounds is the blocking pop alone (one command a round on Redis >= 7)."""
    import allocator._sync_reader

    # Only rounds may acknowledge here: the reader's thread never comes.
    monkeypatch.setattr(allocator._sync_reader, "ACK_DELAY", 600.0)
    rounds: list[list[tuple[Any, ...]]] = []
    made = allocator._sync_reader.round_commands

    def recorded(*args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        commands = made(*args, **kwargs)
        rounds.append(commands)
        return commands

    monkeypatch.setattr(allocator._sync_reader, "round_commands", recorded)
    # Two clients: each worker has a reader of its own, whose rounds
    # carry only that worker's acknowledgements.
    clients = [redis.Redis.from_url(redis_url) for _ in range(2)]
    pools = [FairAllocator(c, pool_name) for c in clients]
    pools[0].extend(["r"])
    cycles = 4
    errors: list[BaseException] = []
    finished: list[FairAllocator] = []

    def worker(pool: FairAllocator) -> None:
        try:
            for _ in range(cycles):
                lease = pool.acquire(timeout=30)
                # Release only once the other waits (or is done): every
                # acquire is served by a push, read by its own round.
                wait_until(
                    lambda: bool(finished) or pool.status().waiting == 1,
                    timeout=30,
                    what="the other waiting",
                )
                assert pool.release(lease)
        except BaseException as exc:
            errors.append(exc)
        finally:
            finished.append(pool)

    first = pools[0].acquire(timeout=5)
    threads = [threading.Thread(target=worker, args=(pool,), daemon=True) for pool in pools]
    for thread in threads:
        thread.start()
    wait_until(lambda: pools[0].status().waiting == 2, what="both workers waiting")
    assert pools[0].release(first)
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    popping = [c for c in rounds if any(command[0] in ("BLMPOP", "BLPOP") for command in c)]
    assert len(popping) >= 2 * cycles
    assert [c for commands in rounds for c in commands if c[0] == "ZREM"] == []
    for pool, made_client in zip(pools, clients, strict=True):
        pool.close()
        made_client.close()


def test_asyncio_waiters_lead_in_turn(redis_url: str, pool_name: str) -> None:
    async def run() -> list[int]:
        client = redis.asyncio.Redis.from_url(redis_url)
        pool = AsyncFairAllocator(client, pool_name)
        await pool.extend(["r"])
        held = await pool.acquire(timeout=5)
        order: list[int] = []

        async def wait(i: int, timeout: float) -> None:
            try:
                lease = await pool.acquire(timeout=timeout)
            except AcquireTimeout:
                order.append(-i)
                return
            order.append(i)
            await pool.release(lease)

        tasks = []
        # Waiter 1 leads first and gives up after 1 s; the lead must pass.
        for i, timeout in ((1, 1.0), (2, 60.0), (3, 60.0)):
            tasks.append(asyncio.create_task(wait(i, timeout)))
            while (await pool.status()).waiting < i:
                await asyncio.sleep(0.01)
        await tasks[0]
        from allocator._async_reader import reader_for as async_reader_for

        reader = async_reader_for(client, pool._pool)
        assert reader._task is None or reader._task.done()  # the tasks lead: no task of its own
        assert await pool.release(held)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        await pool.close()
        await client.aclose()
        return order

    assert asyncio.run(run()) == [-1, 2, 3]
