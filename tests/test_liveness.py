"""Liveness, FIFO and capacity under stalls, lost replies, crowds of dead
tickets and shared clients: every scenario here failed against 0.1.0, each
in the way its docstring says."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from _stallers import gil_waiter, loop_waiter
from _workers import Proc, leaser, server_now
from helpers import Background, Stepper, blocked_readers, wait_until

from allocator import AsyncFairAllocator, FairAllocator, Lease
from allocator._core.keys import KEY_SUFFIXES
from allocator._core.liveness import ALIVE_MS
from allocator._core.steps import Call, Wait

pytestmark = pytest.mark.real_redis
KEY = {suffix: i for i, suffix in enumerate(KEY_SUFFIXES)}


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    made = redis.Redis.from_url(redis_url, decode_responses=True)
    yield made
    made.close()


# -- 1. gc never deletes a live lease ------------------------------------------------


def test_gc_resuming_behind_the_queue_never_deletes_a_lease(client: Any, pool_name: str) -> None:
    """gc pages through the queue from a cursor. When the queue moved past
    the cursor between two steps (here: 100 waiters left, then a newcomer was
    granted at once), 0.1 took the granted ticket for a dead waiter's and
    deleted its lease: release returned False and the resource stayed full
    for ever."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    # A page's worth of waiters of a client that looks alive.
    flows = []
    for _ in range(100):
        flow = pool._pool.acquire(None, None, None, True, cid="live-client")
        enqueue = flow.steps.send(None)
        assert isinstance(flow.steps.send(pool._step(enqueue)), Wait)
        flows.append(flow)

    gc = pool._pool.gc()
    step = gc.send(None)
    while not isinstance(step, Call):  # the maxmemory-policy look-up
        step = gc.send(pool._step(step))
    first_page = pool._step(step)

    # Between two gc steps: the waiters leave, the holder releases, and a
    # newcomer of a client that never waited (no liveness mark) is granted.
    for flow in flows:
        cancel = flow.steps.throw(KeyboardInterrupt())
        assert isinstance(cancel, Call) and cancel.script == "cancel"
        pool._step(cancel)
    assert pool.release(held) is True
    other = FairAllocator(redis.Redis.from_url(_url(client)), pool_name)
    newcomer = other.acquire(blocking=False)
    assert newcomer is not None

    reply = first_page
    while True:
        try:
            step = gc.send(reply)
        except StopIteration as stop:
            report = stop.value
            break
        reply = pool._step(step)
    assert report.dropped_waiters == 0 and report.repaired == 0
    assert other.release(newcomer) is True
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)


def _url(client: Any) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


def test_gc_repairs_a_lease_count_that_disagrees_with_the_live_leases(
    client: Any, pool_name: str
) -> None:
    """What a bug left behind (a count with no lease behind it) does not
    keep a resource full for ever: gc sets it right from the live leases."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)
    res_key = pool._pool.keys[KEY["res"]]
    other = "b" if held.resource == "a" else "a"
    record = client.hget(res_key, other).split("|")
    record[2] = "1"  # used = 1, with no lease
    client.hset(res_key, other, "|".join(record))
    client.zrem(pool._pool.keys[KEY["free"]], *client.zrange(pool._pool.keys[KEY["free"]], 0, -1))
    assert pool.acquire(blocking=False) is None  # the pool looks full

    report = pool.gc()
    assert report.repaired == 1
    got = pool.acquire(blocking=False)
    assert got is not None and got.resource == other
    assert pool.gc().repaired == 0  # the real lease is counted, not "repaired"
    assert pool.release(got) and pool.release(held)


# -- 2. a live waiter keeps its grant and its place --------------------------------


@pytest.mark.parametrize(("worker", "stall"), [(gil_waiter, 3.3), (loop_waiter, 3.0)],
                         ids=["sync-gil-held", "async-loop-blocked"])  # fmt: skip
def test_a_stalled_live_waiter_keeps_its_grant(
    redis_url: str,
    client: Any,
    pool_name: str,
    procs: Callable[..., Proc],
    worker: Any,
    stall: float,
) -> None:
    """A waiter whose client stalls (a C call holding the GIL for 3.3 s, an
    event loop blocked for 3.0 s) while its grant is pushed must get that
    grant: the stall is inside the liveness window. 0.1 took the grant back
    after 2 s and served a requester that came later first."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    early = procs(worker, redis_url, pool_name, stall)
    early.expect("ready")
    wait_until(lambda: pool.status().waiting == 1, what="the early waiter queued")
    early.send("stall")
    early.expect("stalling")
    # The reader's blocking read in flight ends; no other is sent while the
    # client is frozen, so the grant stays on its list.
    wait_until(lambda: blocked_readers(client) == 0, what="no reader blocked")
    assert pool.release(held) is True
    late = procs(leaser, redis_url, pool_name, wait_go=True)
    late.expect("ready")
    late.send("go")
    wait_until(lambda: pool.status().waiting == 1, what="the late waiter queued")

    # The stall ends and the early waiter is granted, reported in either
    # order: when the C call returns, the GIL may pass to the reader thread,
    # which hands the grant over, before the stalling thread reports.
    first: Lease = early.expect_each(("resumed", "granted"), timeout=30)["granted"]
    early.send("release")
    assert early.expect("released") is True
    second: Lease = late.expect("granted", timeout=30)
    assert held.token < first.token < second.token
    late.send("release")
    assert late.expect("released") is True
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)


def test_a_waiter_stopped_past_the_liveness_window_is_told_and_queues_again(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """Past the liveness window the grant is taken back and the next waiter
    is served; the stopped waiter, resumed, learns it at once, queues again
    and is served; nothing of it is left behind."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    early = procs(leaser, redis_url, pool_name, wait_go=True)
    early.expect("ready")
    early.send("go")
    wait_until(lambda: pool.status().waiting == 1, what="the early waiter queued")
    wait_until(lambda: blocked_readers(client) == 1, what="its reader blocked")
    early.pause()
    late = procs(leaser, redis_url, pool_name, wait_go=True)
    late.expect("ready")
    late.send("go")
    wait_until(lambda: pool.status().waiting == 2, what="the late waiter queued")
    assert pool.release(held) is True  # granted to the stopped early waiter
    second: Lease = late.expect("granted", timeout=3 * ALIVE_MS / 1000)
    assert second.token > held.token
    early.resume()
    late.send("release")
    assert late.expect("released") is True
    third: Lease = early.expect("granted", timeout=30)
    assert third.token > second.token
    early.send("release")
    assert early.expect("released") is True
    pool.gc()
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)


# -- 3. a grant whose pop was lost is delivered again -------------------------------


def test_a_grant_popped_and_lost_in_flight_is_delivered_again(client: Any, pool_name: str) -> None:
    """The reader popped the grant but its reply never arrived (a socket
    timeout, a dead connection): 0.1 took the empty list for a delivery and
    the waiter waited out its timeout while the resource sat leased to
    nobody. The grant is not acknowledged, so it is put back on the list."""
    pool = FairAllocator(client, pool_name, lease_ttl=60)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Stepper(pool, timeout=20)
    waiter.run_step()
    assert isinstance(waiter.step, Wait)
    assert pool.release(held) is True
    lost = client.lpop(pool._pool.signal_key(waiter.reader.cid_for(pool._pool)))
    assert lost is not None and lost.startswith("g|")
    while not waiter.done:
        waiter.run_step()
    assert waiter.value.resource == "r" and waiter.value.token > held.token
    assert pool.release(waiter.value) is True


def test_a_server_stall_longer_than_the_socket_timeout_strands_no_grant(
    redis_url: str, pool_name: str
) -> None:
    """A client with socket_timeout=0.5 and a 3.1 s server stall while its
    waiter waits and the holder releases: the waiter is served well inside
    the lease ttl (0.1 stranded the grant for the whole ttl)."""
    admin = redis.Redis.from_url(redis_url)
    small = redis.Redis.from_url(redis_url, socket_timeout=0.5)
    pool = FairAllocator(admin, pool_name, lease_ttl=20)
    waiting = FairAllocator(small, pool_name, lease_ttl=20)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Background(lambda: waiting.acquire(timeout=15))
    wait_until(lambda: pool.status().waiting == 1, what="queued")
    server_pid = int(admin.info("server")["process_id"])
    if admin.connection_pool.connection_kwargs.get("port") == 6379:
        pytest.skip("stalls the server by SIGSTOP: only a private one")
    os.kill(server_pid, signal.SIGSTOP)  # the whole server stalls
    try:
        wait_until(lambda: frozen(redis_url), what="the server stalled")
        released = Background(lambda: pool.release(held))  # runs when the server wakes
        # The stall is the point: longer than the waiter's socket timeout.
        time.sleep(3.1)
    finally:
        os.kill(server_pid, signal.SIGCONT)
    # The release gives up at its 2 s budget; the server runs it on waking.
    with contextlib.suppress(redis.TimeoutError):
        assert released.join(30) is True
    got = waiter.join(30)
    assert got.resource == "r"
    assert waiting.release(got) is True
    small.close()
    admin.close()


def frozen(url: str) -> bool:
    probe = redis.Redis.from_url(url, socket_timeout=0.2)
    try:
        probe.ping()
        return False
    except redis.TimeoutError:
        return True
    finally:
        probe.close()


# -- 4. dead tickets are dropped in bounded batches -------------------------------


def test_a_crowd_of_dead_tickets_is_dropped_in_bounded_batches(client: Any, pool_name: str) -> None:
    """2,000 tickets of a dead client at the head: one release drops at most
    200 (0.1 dropped them all in one script run, and 150,000 blocked the
    server for 3 s); the live waiter behind them is still served."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    q = pool._pool.keys[KEY["q"]]
    with client.pipeline(transaction=False) as pipe:
        for i in range(2000):
            pipe.xadd(q, {"l": f"dead-{i}", "c": "dead-client", "t": "60000"})
        pipe.execute()
    recs = pool._pool.keys[KEY["recs"]]
    for entry_id, fields in client.xrange(q, "-", "+"):
        if fields["l"].startswith("dead-"):
            client.hset(recs, fields["l"], f"W|{entry_id}")
    live = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: client.xlen(q) == 2001, what="the live waiter queued")
    client.zadd(pool._pool.keys[KEY["alive"]], {"dead-client": 0})
    assert FairAllocator(client, pool_name).release(held) is True
    # The release's own run dropped at most 200; the waiter's heartbeats
    # (told "more") drop the rest and serve it.
    got = live.join(30)
    assert got.resource == "r"
    assert client.xlen(q) == 0
    assert pool.release(got) is True


def test_one_release_drops_no_more_than_the_limit(client: Any, pool_name: str) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    q = pool._pool.keys[KEY["q"]]
    for i in range(1200):
        entry_id = client.xadd(q, {"l": f"dead-{i}", "c": "dead-client", "t": "60000"})
        client.hset(pool._pool.keys[KEY["recs"]], f"dead-{i}", f"W|{entry_id}")
    assert pool.release(held) is True  # no live waiter: dispatch stops at the limit
    assert client.xlen(q) == 1200 - 200
    assert pool.gc().dropped_waiters == 1000
    assert client.xlen(q) == 0


# -- 5. one reader per client, for every pool ----------------------------------------


def test_twenty_pools_share_a_bounded_connection_pool(redis_url: str, pool_name: str) -> None:
    """Twenty pools on one client whose connection pool holds 4: every
    waiter is served (0.1 parked a blocking connection per pool and failed
    with 'No connection available')."""
    bounded = redis.BlockingConnectionPool.from_url(redis_url, max_connections=4, timeout=20)
    client = redis.Redis(connection_pool=bounded)
    pools = [FairAllocator(client, f"{pool_name}-{i}") for i in range(20)]
    held = []
    for pool in pools:
        pool.extend(["r"])
        held.append(pool.acquire(timeout=5))
    waiters = [Background(lambda p=pool: p.acquire(timeout=30)) for pool in pools]
    for pool in pools:
        wait_until(lambda p=pool: p.status().waiting == 1, what="queued")
    for pool, lease in zip(pools, held, strict=True):
        assert pool.release(lease) is True
    for pool, waiter in zip(pools, waiters, strict=True):
        got = waiter.join(40)
        assert pool.release(got) is True
    client.close()


def test_twenty_async_pools_share_a_bounded_connection_pool(redis_url: str, pool_name: str) -> None:
    async def scenario() -> None:
        bounded = redis.asyncio.BlockingConnectionPool.from_url(
            redis_url, max_connections=4, timeout=20
        )
        client = redis.asyncio.Redis(connection_pool=bounded)
        pools = [AsyncFairAllocator(client, f"{pool_name}-{i}") for i in range(20)]
        held = []
        for pool in pools:
            await pool.extend(["r"])
            held.append(await pool.acquire(timeout=5))
        waiters = [asyncio.ensure_future(pool.acquire(timeout=30)) for pool in pools]
        for pool in pools:
            while (await pool.status()).waiting != 1:
                await asyncio.sleep(0.01)
        for pool, lease in zip(pools, held, strict=True):
            assert await pool.release(lease) is True
        for pool, got in zip(pools, await asyncio.gather(*waiters), strict=True):
            assert await pool.release(got) is True
        await client.aclose()

    asyncio.run(scenario())


# -- 6. the smaller ones ---------------------------------------------------------------


def connections_received(client: Any) -> int:
    return int(client.info("stats")["total_connections_received"])


def test_contended_async_acquires_do_not_reconnect(
    redis_url: str, client: Any, pool_name: str
) -> None:
    """30 acquires that each wait: 0.1 cancelled the reader when its last
    waiter left, which cost a new connection (15 for 30 acquires)."""

    async def scenario() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        apool = AsyncFairAllocator(aclient, pool_name)
        await apool.extend(["r"])
        before = connections_received(client)
        for _ in range(30):
            held = await apool.acquire(timeout=5)
            waiter = asyncio.ensure_future(apool.acquire(timeout=10))
            while (await apool.status()).waiting != 1:
                await asyncio.sleep(0.001)
            await apool.release(held)
            await apool.release(await waiter)
        assert connections_received(client) - before <= 4
        await aclient.aclose()

    asyncio.run(scenario())


def test_a_tiny_socket_timeout_does_not_starve_the_reader(
    redis_url: str, client: Any, pool_name: str
) -> None:
    """With socket_timeout=0.05 the reader's blocking read outlasts the
    socket timeout by design; 0.1 timed out and reconnected over and over."""
    tiny = redis.Redis.from_url(redis_url, socket_timeout=0.05)
    pool = FairAllocator(client, pool_name)
    waiting = FairAllocator(tiny, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    before = connections_received(client)
    waiter = Background(lambda: waiting.acquire(timeout=20))
    wait_until(lambda: pool.status().waiting == 1, what="queued")
    # The hold is the point: several of the reader's blocking reads.
    wait_until(lambda: server_now(client) > held.granted_at + 2.5, timeout=10)
    assert pool.release(held) is True
    got = waiter.join(30)
    assert waiting.release(got) is True
    assert connections_received(client) - before <= 4
    tiny.close()


def test_a_dropped_rate_leaves_no_log_and_a_readded_resource_a_full_budget(
    client: Any, pool_name: str
) -> None:
    pool = FairAllocator(client, pool_name)
    rlog = pool._pool.keys[KEY["rlog"]]
    pool.extend(["k"], rate=(2, 60))
    for _ in range(2):
        lease = pool.acquire(timeout=5)
        pool.release(lease)
    assert pool.acquire(blocking=False) is None  # the budget is spent
    pool.extend(["k"], rate=None)
    assert client.zcard(rlog) == 0
    pool.extend(["k"], rate=(2, 60))
    for _ in range(2):  # a budget that nothing from before counts against
        lease = pool.acquire(blocking=False)
        assert lease is not None
        pool.release(lease)
    pool.remove(["k"])
    assert client.zcard(rlog) == 0
    pool.extend(["k"], rate=(1, 60))
    assert pool.acquire(blocking=False) is not None


def test_the_exit_hook_is_registered_once(client: Any, pool_name: str) -> None:
    before = atexit._ncallbacks()
    for _ in range(3):  # each round starts a reader and lets it end
        pool = FairAllocator(redis.Redis.from_url(_url(client)), pool_name)
        pool.extend(["r"])
        held = pool.acquire(timeout=5)
        waiter = Background(lambda p=pool: p.acquire(timeout=10))
        wait_until(lambda p=pool: p.status().waiting == 1)
        pool.release(held)
        pool.release(waiter.join())
    assert atexit._ncallbacks() == before


def test_keepalive_stop_passes_the_callers_cancellation_on(redis_url: str, pool_name: str) -> None:
    from allocator._async_keepalive import Keeper

    async def scenario() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        apool = AsyncFairAllocator(aclient, pool_name)
        await apool.extend(["r"])
        lease = await apool.acquire(timeout=5, ttl=30)
        keeper = Keeper(apool, lease)

        async def stopper() -> str:
            await keeper.stop()
            return "finished"

        task = asyncio.ensure_future(stopper())
        await asyncio.sleep(0)  # the stopper now awaits the keeper's task
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        await apool.release(lease)
        await aclient.aclose()

    asyncio.run(scenario())


# -- a chaos run: gc processes and workers stopped for seconds -----------------------


@pytest.mark.slow  # a chaos run: workers and gc processes stopped at random
def test_chaos_with_gc_processes_and_stopped_workers(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc], tmp_path: Any
) -> None:
    """Six workers churn on three resources while two gc processes loop;
    workers and gc processes are SIGSTOPped at random for 1-3 s (inside the
    liveness window), gc ones between any two of their steps. From the
    ledgers: FIFO by ticket among these live waiters, no lease lost while
    its holder lives, never two holders of a resource; the pool whole at
    the end, with nothing for gc to repair."""
    import json
    import random

    from _stallers import churner
    from _workers import gc_loop

    pool = FairAllocator(client, pool_name)
    pool.extend(["a", "b", "c"])
    ledgers = [tmp_path / f"w{i}.jsonl" for i in range(6)]
    workers = [procs(churner, redis_url, pool_name, str(path), i) for i, path in enumerate(ledgers)]
    gcs = [procs(gc_loop, redis_url, pool_name, every=0.02) for _ in range(2)]
    for proc in (*workers, *gcs):
        proc.expect("ready")
    rng = random.Random(13)
    for _ in range(5):
        victim = rng.choice((*workers, *gcs))
        victim.pause()
        # Stopped for a while: the duration is the point here.
        time.sleep(rng.uniform(1.0, 3.0))
        victim.resume()
    rounds = 0
    for w in workers:
        w.send("stop")
        rounds += w.expect("done")
    for g in gcs:
        g.send("stop")
        g.until("stopped")

    records = [json.loads(line) for path in ledgers for line in path.read_text().splitlines()]
    assert records and len(records) == rounds
    assert all(r["released"] for r in records), "a lease was lost while its holder lived"
    by_ticket = sorted(records, key=lambda r: tuple(int(x) for x in r["ticket"].split("-")))
    grants = [r["granted_at"] for r in by_ticket]
    assert grants == sorted(grants), "a later ticket was granted before an earlier one"
    for name in "abc":
        held = sorted((r for r in records if r["resource"] == name), key=lambda r: r["granted_at"])
        for before, after in itertools.pairwise(held):
            assert after["granted_at"] >= before["left"], f"two holders of {name}"
            assert after["token"] > before["token"]
    report = pool.gc()
    assert report.repaired == 0
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (3, 0, 0)
