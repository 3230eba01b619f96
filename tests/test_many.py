"""Several resources at once (docs/concepts.md#several-resources-at-once):
acquire_many and lease_many.

The scenarios of the first part run in every flavour (conftest.FLAVOURS);
those of the second part use several OS processes against the real server
(workers in ``_workers.py``).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
from _workers import server_now
from helpers import Background, ticket_key, wait_until

from allocator import AcquireTimeout, Lease, LeaseLost

# -- the core's part, no Redis ----------------------------------------------------


def test_core_reads_a_multi_grant_reply_and_its_messages() -> None:
    from allocator._core.messages import RECHECK
    from allocator._core.pool import Pool
    from allocator._core.reader import Reader

    pool = Pool.create("p", lease_ttl=1, bind_ttl=1, prefix="a")
    row = ["5-{}", "17950000000000{}", "1795357126155123", "1795357126215", "60000", "gpu|{}"]
    reply = [b"granted_many"]
    for i in range(3):
        reply += [field.format(i).encode() for field in row]
    leases = pool._state("acquire_many", "lid", reply)
    assert isinstance(leases, list)
    assert [lease.id for lease in leases] == ["lid", "lid.2", "lid.3"]
    assert [lease.resource for lease in leases] == ["gpu|0", "gpu|1", "gpu|2"]
    assert [lease.ticket for lease in leases] == ["5-0", "5-1", "5-2"]
    with pytest.raises(ValueError, match="count"):
        pool._state("acquire_many", "lid", [b"toomany", b"2"])
    with pytest.raises(Exception, match="unexpected"):
        pool._state("acquire_many", "lid", [b"granted_many", b"5-0"])

    # Pushed grants: the first lease on the request's own ticket, the others
    # on the entries behind it; anything else is stale.
    first = "g|lid|5-0|17|1795357126155123|60000|gpu-0"
    second = "g|lid.2|5-1|18|1795357126155123|60000|gpu-1"
    assert pool._message(first, "lid", "5-0", 2).id == "lid"  # type: ignore[union-attr]
    assert pool._message(second, "lid", "5-0", 2).id == "lid.2"  # type: ignore[union-attr]
    assert pool._message(second, "lid", "5-0") is None  # a single waiter takes no lid.2
    assert pool._message(second, "lid", "5-1", 2) is None  # not behind the ticket
    assert pool._message("g|lid.3|5-2|1|1|1|r", "lid", "5-0", 2) is None  # beyond count
    assert pool._message("x|lid.2", "lid", "5-0", 2) == RECHECK

    # The hub routes every lease of a request to the request's waiter.
    hub = Reader(1.0)
    hub.register(pool, "lid", "inbox")
    key = pool.signal_key(hub.cid)
    assert hub.route(key, second, 0.0)[:2] == ("inbox", second)
    assert hub.route(key, "x|lid.2", 0.0)[:2] == ("inbox", "x|lid.2")
    acks, _ = hub.plan()
    assert acks == [(pool.keys[12], ["lid.2"])]


def test_core_decides_what_the_exit_of_lease_many_raises() -> None:
    from allocator._core.pool import Pool

    pool = Pool.create("p", lease_ttl=1, bind_ttl=1, prefix="a")
    held = [
        Lease(resource=r, token=t, id=f"id{t}", ticket=f"1-{t}", expires_at=9.0, ttl=1.0,
              granted_at=1.0, pool="p")
        for r, t in (("a", 1), ("b", 2))
    ]  # fmt: skip
    kept = LeaseLost("p", "b", 2, "renewal failed")
    down = ConnectionError("server gone")
    assert pool.lost_many(held, [True, True], [None, None]) is None
    assert pool.lost_many(held, [True, False], [None, kept]) is kept
    lost = pool.lost_many(held, [down, False], [None, None])
    assert isinstance(lost, LeaseLost) and lost.resource == "b"
    assert pool.lost_many(held, [True, down], [None, None]) is down


def queue_keys(pool: Any) -> tuple[str, str, str]:
    inner = getattr(pool, "inner", pool)
    keys = inner._pool.keys
    return keys[5], keys[7], keys[0]  # q, exp, meta


def nothing_waits(pool: Any, raw: Any) -> None:
    """The queue is empty (a grant takes its tickets out): no waiter, no
    place-holder; every lease has its deadline."""
    q, exp, meta = queue_keys(pool)
    assert pool.status().waiting == 0
    assert raw.xlen(q) == 0
    assert raw.zcard(exp) == pool.status().leased
    assert int(raw.hget(meta, "xw") or 0) == 0


def test_acquire_many_grants_distinct_resources_each_with_its_own_lease(pool: Any) -> None:
    pool.extend(["g0", "g1", "g2", "g3"])
    leases = pool.acquire_many(3, timeout=5)
    assert len(leases) == 3 and all(isinstance(lease, Lease) for lease in leases)
    assert len({lease.resource for lease in leases}) == 3
    assert len({lease.id for lease in leases}) == 3
    assert len({lease.ticket for lease in leases}) == 3
    # One step: granted at the same server instant.
    assert len({lease.granted_at for lease in leases}) == 1
    status = pool.status()
    assert (status.size, status.free, status.leased, status.waiting) == (4, 1, 3, 0)
    # Each lease lives on its own: renew and release one by one.
    renewed = pool.renew(leases[1], ttl=30)
    assert renewed.expires_at <= leases[1].expires_at
    assert pool.release(leases[0]) is True
    assert pool.status().leased == 2
    assert pool.release(leases[0]) is False
    assert all(pool.release(lease) for lease in leases[1:])
    assert pool.status().free == 4


def test_count_one_and_the_whole_pool(pool: Any, raw: Any) -> None:
    pool.extend(["a", "b"])
    (one,) = pool.acquire_many(1, timeout=5)
    pool.release(one)
    both = pool.acquire_many(2, timeout=5)
    assert {lease.resource for lease in both} == {"a", "b"}
    assert pool.acquire_many(1, blocking=False) is None
    for lease in both:
        pool.release(lease)
    nothing_waits(pool, raw)


def test_count_larger_than_the_pool_is_refused(pool: Any, raw: Any) -> None:
    with pytest.raises(ValueError, match="count"):
        pool.acquire_many(1, timeout=1)  # an empty pool has size 0
    pool.extend(["a", "b"])
    with pytest.raises(ValueError, match="count"):
        pool.acquire_many(3, timeout=1)
    with pytest.raises(ValueError, match="count"):
        pool.acquire_many(3, blocking=False)
    nothing_waits(pool, raw)
    assert len(pool.acquire_many(2, timeout=5)) == 2


def test_capacity_counts_once_per_resource(pool: Any) -> None:
    # A resource with several free slots is one resource: a request for two
    # gets two distinct ones, even when the big one comes first every time.
    pool.extend(["big"], capacity=3, priority=10)
    pool.extend(["small"])
    leases = pool.acquire_many(2, timeout=5)
    assert sorted(lease.resource for lease in leases) == ["big", "small"]
    assert leases[0].resource == "big"  # priority order within the grant
    # Only "big" has free slots now: one resource, so a request for two waits.
    assert pool.acquire_many(2, blocking=False) is None
    with pytest.raises(AcquireTimeout):
        pool.acquire_many(2, timeout=0.2)
    assert pool.acquire(timeout=5).resource == "big"


def test_shared_resources_of_high_priority_each_count_once(pool: Any) -> None:
    pool.extend(["h1", "h2"], capacity=4, priority=5)
    pool.extend(["l1", "l2"])
    first = pool.acquire_many(3, timeout=5)
    assert sorted(lease.resource for lease in first) == ["h1", "h2", "l1"]
    second = pool.acquire_many(3, timeout=5)  # h1, h2 still have slots
    assert sorted(lease.resource for lease in second) == ["h1", "h2", "l2"]
    assert pool.acquire_many(3, blocking=False) is None  # two resources left


def test_priorities_and_least_recently_free_apply_per_resource(pool: Any) -> None:
    pool.extend(["low1", "low2"], priority=0)
    pool.extend(["high"], priority=5)
    first = pool.acquire(timeout=5)
    assert first.resource == "high"
    pool.release(first)
    solo = pool.acquire(timeout=5)  # high again, then low1 (free for longest)
    pool.release(pool.acquire(timeout=5))
    pool.release(solo)
    leases = pool.acquire_many(3, timeout=5)
    assert [lease.resource for lease in leases] == ["high", "low2", "low1"]


def test_rate_limited_and_quarantined_resources_do_not_count(pool: Any) -> None:
    pool.extend(["limited"], rate=(1, 600), priority=5)
    pool.extend(["x", "y"])
    once = pool.acquire(timeout=5)
    assert once.resource == "limited"
    pool.release(once)  # its budget is spent: throttled, not free
    assert pool.status().free == 2
    with pytest.raises(AcquireTimeout):
        pool.acquire_many(3, timeout=0.2)
    pair = pool.acquire_many(2, timeout=5)
    assert {lease.resource for lease in pair} == {"x", "y"}
    for lease in pair:
        pool.release(lease, quarantine=600 if lease.resource == "x" else None)
    assert pool.acquire_many(2, blocking=False) is None
    (single,) = pool.acquire_many(1, timeout=5)
    assert single.resource == "y"


def test_rate_limit_counts_each_grant(pool: Any) -> None:
    pool.extend(["a", "b"], rate=(2, 600))
    for _ in range(2):
        for lease in pool.acquire_many(2, timeout=5):
            pool.release(lease)
    # Two grants each in the window: both are out of budget.
    assert pool.status().free == 0
    assert pool.acquire(blocking=False) is None


def test_nonblocking_never_passes_a_waiter(pool: Any, raw: Any) -> None:
    pool.extend(["a", "b", "c"])
    held = pool.acquire_many(2, timeout=5)
    waiter = Background(lambda: pool.acquire_many(2, timeout=20))
    wait_until(lambda: pool.status().waiting == 1, what="the multi request queued")
    # One resource is free, but a request for two waits ahead: nobody passes.
    assert pool.status().free == 1
    assert pool.acquire(blocking=False) is None
    assert pool.acquire_many(1, blocking=False) is None
    pool.release(held[0])
    got = waiter.join()
    assert len(got) == 2
    pool.release(held[1])
    assert pool.acquire_many(1, blocking=False) is not None


def test_head_of_line_single_behind_multi_waits(pool: Any, raw: Any) -> None:
    """FIFO between single and multi requests: a single request that came
    after a multi one is not served before it, even with a resource free."""
    pool.extend(["a", "b", "c"])
    held = pool.acquire_many(3, timeout=5)
    multi = Background(lambda: pool.acquire_many(2, timeout=20))
    wait_until(lambda: pool.status().waiting == 1, what="the multi request queued")
    single = Background(lambda: pool.acquire(timeout=20))
    wait_until(lambda: pool.status().waiting == 2, what="the single request queued")
    pool.release(held[0])
    # Decided inside release's own script run: the free resource stays free.
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 2, 2)
    assert not multi.done and not single.done
    pool.release(held[1])
    pair = multi.join()
    # The single request is still behind: all three are held.
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (0, 3, 1)
    pool.release(held[2])
    one = single.join()
    assert ticket_key(pair[0].ticket) < ticket_key(one.ticket)
    for lease in (*pair, one):
        pool.release(lease)
    nothing_waits(pool, raw)


def test_timeout_leaves_nothing_behind(pool: Any, raw: Any) -> None:
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)
    with pytest.raises(AcquireTimeout):
        pool.acquire_many(2, timeout=0.3)
    nothing_waits(pool, raw)
    # A single request is served at once: no ghost is left at the head.
    other = pool.acquire(blocking=False)
    assert other is not None
    pool.release(held)
    pool.release(other)
    assert len(pool.acquire_many(2, timeout=5)) == 2


def test_timeout_racing_the_grant_leaks_nothing(pool: Any, raw: Any) -> None:
    pool.extend(["a", "b", "c"])
    for _ in range(20):
        held = pool.acquire_many(3, timeout=5)
        racer = Background(lambda: pool.acquire_many(3, timeout=0.05))
        for lease in held:
            pool.release(lease)
        try:
            got = racer.join()
        except AcquireTimeout:
            got = []
        for lease in got:
            assert pool.release(lease) is True
        status = pool.status()
        assert (status.free, status.leased, status.waiting) == (3, 0, 0)
    nothing_waits(pool, raw)


def test_lease_many_releases_all_on_exit(pool: Any) -> None:
    pool.extend(["a", "b", "c"])
    with pool.lease_many(2, timeout=5) as leases:
        assert len(leases) == 2
        assert pool.status().leased == 2
    assert pool.status().leased == 0
    with pytest.raises(KeyError, match="boom"):
        with pool.lease_many(3, timeout=5):
            raise KeyError("boom")
    assert pool.status().leased == 0


def test_lease_many_exit_raises_when_one_was_lost(pool: Any) -> None:
    pool.extend(["a", "b"])
    with pytest.raises(LeaseLost):
        with pool.lease_many(2, timeout=5) as leases:
            pool.remove([leases[1].resource], force=True)
    status = pool.status()
    assert (status.size, status.leased) == (1, 0)


def test_lease_many_keepalive_renews_all(pool: Any, raw: Any) -> None:
    pool.extend(["a", "b"])
    # A ttl that a loaded machine's scheduling cannot outlast between two
    # renewals (every ttl/3), yet short enough to pass within the test.
    with pool.lease_many(2, timeout=5, ttl=2.0, keepalive=True) as leases:
        deadline = max(lease.expires_at for lease in leases)
        # Past every lease's first deadline on the server clock: kept alive.
        wait_until(lambda: server_now(raw) > deadline + 0.5, what="past the first deadline")
        assert pool.status().leased == 2
    assert pool.status().leased == 0


def test_threads_mixing_single_and_multi_keep_capacity(pool: Any) -> None:
    pool.extend(["a", "b", "c"])
    inside: dict[str, int] = {"a": 0, "b": 0, "c": 0}
    worst = {"over": 0}
    lock = threading.Lock()

    def work(count: int) -> None:
        for _ in range(8):
            leases = pool.acquire_many(count, timeout=30)
            with lock:
                for lease in leases:
                    inside[lease.resource] += 1
                    worst["over"] = max(worst["over"], inside[lease.resource])
            with lock:
                for lease in leases:
                    inside[lease.resource] -= 1
            for lease in leases:
                assert pool.release(lease) is True

    runs = [Background(lambda c=c: work(c)) for c in (1, 2, 3, 1, 2)]
    for run in runs:
        run.join(60)
    assert worst["over"] == 1
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (3, 0, 0)


# -- several OS processes, real server ----------------------------------------------


@pytest.fixture
def real(redis_url: str, pool_name: str) -> Any:
    import redis

    from allocator import FairAllocator

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield FairAllocator(client, pool_name), client
    client.close()


def queued(pool: Any, waiting: int) -> None:
    wait_until(lambda: pool.status().waiting == waiting, timeout=30, what=f"{waiting} waiting")


def shape(pool: Any) -> tuple[int, int, int]:
    status = pool.status()
    return status.free, status.leased, status.waiting


@pytest.mark.real_redis
def test_processes_fifo_between_single_and_multi(
    real: Any, redis_url: str, pool_name: str, procs: Any
) -> None:
    from _workers import leaser, many_leaser

    pool, _raw = real
    pool.extend(["a", "b", "c"])
    held = pool.acquire_many(3, timeout=5)
    # In this order: two, one, three, one.
    p1 = procs(many_leaser, redis_url, pool_name, 2, wait_go=True)
    p2 = procs(leaser, redis_url, pool_name, wait_go=True)
    p3 = procs(many_leaser, redis_url, pool_name, 3, wait_go=True)
    p4 = procs(leaser, redis_url, pool_name, wait_go=True)
    for number, proc in enumerate((p1, p2, p3, p4), start=1):
        proc.expect("ready")
        proc.send("go")
        queued(pool, number)

    # Each release serves the queue in its own script run, so the shape of
    # the pool right after it is decided.
    pool.release(held[0])
    assert shape(pool) == (1, 2, 4)  # the head wants two
    pool.release(held[1])
    first = p1.expect("granted")
    assert shape(pool) == (0, 3, 3)
    pool.release(held[2])
    second = p2.expect("granted")
    assert shape(pool) == (0, 3, 2)
    p2.send("release")
    assert p2.expect("released") is True
    # One resource is free and a single request waits, but a request for
    # three is ahead of it: nobody passes the head.
    assert shape(pool) == (1, 2, 2)
    assert p4.poll() is None
    p1.send("release")
    assert p1.expect("released") == [True, True]
    third = p3.expect("granted")
    assert shape(pool) == (0, 3, 1)
    p3.send("release")
    assert p3.expect("released") == [True, True, True]
    fourth = p4.expect("granted")
    tickets = [first[0].ticket, second.ticket, third[0].ticket, fourth.ticket]
    assert tickets == sorted(tickets, key=ticket_key)
    p4.send("release")
    p4.expect("released")
    assert shape(pool) == (3, 0, 0)


@pytest.mark.real_redis
def test_processes_multi_is_not_starved_by_single_requests(
    real: Any, redis_url: str, pool_name: str, procs: Any
) -> None:
    from _workers import churner, many_leaser

    pool, _raw = real
    pool.extend(["a", "b"])
    # Three processes keep both resources busy, one request after another:
    # at every moment somebody holds one, so a request for both is served
    # only because it keeps its place at the head.
    singles = [procs(churner, redis_url, pool_name, 1) for _ in range(3)]
    for proc in singles:
        proc.expect("round")
    multi = procs(many_leaser, redis_url, pool_name, 2, timeout=60)
    multi.expect("ready")
    leases = multi.expect("granted", timeout=60)
    assert {lease.resource for lease in leases} == {"a", "b"}
    multi.send("release")
    assert multi.expect("released") == [True, True]
    for proc in singles:
        proc.send("stop")
    for proc in singles:
        assert proc.until("stopped") > 0
    pool.gc()
    assert shape(pool) == (2, 0, 0)


@pytest.mark.real_redis
def test_processes_dead_holder_of_several_frees_all_after_its_ttl(
    real: Any, redis_url: str, pool_name: str, procs: Any
) -> None:
    from _workers import many_leaser

    pool, raw = real
    pool.extend(["a", "b", "c"])
    holder = procs(many_leaser, redis_url, pool_name, 3, ttl=1.0)
    holder.expect("ready")
    before = holder.expect("granted")
    holder.kill()
    assert shape(pool)[1] == 3
    # A waiter reclaims them all at their deadline (no gc job needed).
    after = pool.acquire_many(3, timeout=30)
    old = {lease.resource: lease.token for lease in before}
    assert all(lease.token > old[lease.resource] for lease in after)
    for lease in after:
        pool.release(lease)
    nothing_waits(pool, raw)


@pytest.mark.real_redis
def test_processes_timeout_interrupt_and_death_of_a_waiter_leave_nothing(
    real: Any, redis_url: str, pool_name: str, procs: Any
) -> None:
    from _workers import leaser, many_leaser

    pool, raw = real
    pool.extend(["a", "b"])
    held = pool.acquire_many(2, timeout=5)
    timed = procs(many_leaser, redis_url, pool_name, 2, timeout=0.5)
    timed.expect("ready")
    timed.expect("timeout")
    assert pool.status().waiting == 0

    interrupted = procs(many_leaser, redis_url, pool_name, 2, timeout=None)
    interrupted.expect("ready")
    queued(pool, 1)
    os.kill(interrupted.pid, signal.SIGINT)
    interrupted.expect("interrupted")
    assert pool.status().waiting == 0

    # A waiter killed at the head holds up those behind it for its liveness
    # window at most, place-holders included.
    dead = procs(many_leaser, redis_url, pool_name, 2, wait_go=True)
    dead.expect("ready")
    dead.send("go")
    queued(pool, 1)
    single = procs(leaser, redis_url, pool_name, wait_go=True)
    single.expect("ready")
    single.send("go")
    queued(pool, 2)
    dead.kill()
    pool.release(held[0])
    got = single.expect("granted", timeout=30)
    single.send("release")
    single.expect("released")
    assert got.resource == held[0].resource
    pool.release(held[1])
    pool.gc()
    nothing_waits(pool, raw)
    assert shape(pool) == (2, 0, 0)


@pytest.mark.real_redis
def test_processes_never_show_a_partial_grant(
    real: Any, redis_url: str, pool_name: str, procs: Any
) -> None:
    from _workers import churner

    pool, _raw = real
    pool.extend(["a", "b", "c", "d"])
    # Only requests for two, whose leases end by expiry (both at one
    # deadline, reclaimed in one run): every snapshot holds an even number.
    pairs = [procs(churner, redis_url, pool_name, 2, expire=0.02) for _ in range(3)]
    for proc in pairs:
        proc.expect("round")
    seen = set()
    for _ in range(300):
        status = pool.status()
        assert status.leased % 2 == 0, status
        assert sum(row.leases for row in status.resources) == status.leased
        seen.add(status.leased)
    for proc in pairs:
        proc.send("stop")
    for proc in pairs:
        proc.until("stopped")
    assert seen - {0}, "no snapshot caught a grant"


@pytest.mark.real_redis
def test_a_grant_that_lost_a_lease_before_pickup_is_ended_whole(real: Any) -> None:
    """If one lease of a pushed grant ends before its waiter took it (as an
    expiry would), the waiter never keeps the others: its next look ends
    them and queues again, and it is served whole."""
    from allocator._core.steps import Wait

    pool, raw = real
    pool.extend(["a", "b"])
    held = pool.acquire_many(2, timeout=5)
    reader = pool._reader()
    flow = pool._pool.acquire_many(2, 30, None, True, cid=reader.cid_for(pool._pool))
    reader.register(pool._pool, flow.lid)
    try:
        step = flow.steps.send(None)  # queue
        step = flow.steps.send(pool._step(step))
        assert isinstance(step, Wait)  # queued behind nobody, nothing free
        for lease in held:
            pool.release(lease)  # both granted and pushed, in one run
        recs = pool._pool.keys[6]
        record = raw.hget(recs, f"{flow.lid}.2").split("|")
        second = Lease(
            resource=record[8].split("\0")[0], token=int(record[2]), id=f"{flow.lid}.2",
            ticket=record[1],
            expires_at=int(record[4]) / 1000, ttl=60.0, granted_at=int(record[3]) / 1e6,
            pool=pool.name,
        )  # fmt: skip
        assert pool.release(second) is True  # gone before anyone popped it
        while True:
            try:
                step = flow.steps.send(pool._step(step))
            except StopIteration as stop:
                leases = stop.value
                break
    finally:
        reader.unregister(flow.lid)
    assert [lease.id for lease in leases] == [flow.lid, f"{flow.lid}.2"]
    assert leases[1].token > second.token
    assert shape(pool) == (0, 2, 0)
    for lease in leases:
        assert pool.release(lease) is True
    nothing_waits(pool, raw)


@pytest.mark.real_redis
def test_gc_drops_a_dead_multi_waiter_with_its_place_holders(
    real: Any, redis_url: str, pool_name: str, procs: Any
) -> None:
    from _workers import leaser, many_leaser

    from allocator._core.liveness import ALIVE_MS

    pool, raw = real
    pool.extend(["a", "b", "c"])
    held = pool.acquire_many(3, timeout=5)
    ahead = procs(leaser, redis_url, pool_name, wait_go=True)
    ahead.expect("ready")
    ahead.send("go")
    queued(pool, 1)
    dead = procs(many_leaser, redis_url, pool_name, 3, wait_go=True)
    dead.expect("ready")
    dead.send("go")
    queued(pool, 2)
    q, _exp, meta = queue_keys(pool)
    assert int(raw.hget(meta, "xw")) == 2
    dead.kill()
    # Its presence tells it gone: a gc finds it absent and starts its
    # grace; the first gc after the grace drops it (one waiter, whatever it
    # asked for), long before its liveness mark runs out.
    wait_until(lambda: pool.gc().dropped_waiters == 1, timeout=ALIVE_MS / 1000, what="dropped")
    assert pool.status().waiting == 1
    assert int(raw.hget(meta, "xw")) == 0
    assert raw.xlen(q) == 1  # the live waiter
    pool.release(held[0])
    ahead.expect("granted")
    ahead.send("release")
    ahead.expect("released")
    for lease in held[1:]:
        pool.release(lease)
    nothing_waits(pool, raw)


@pytest.mark.real_redis
def test_async_cancellation_of_acquire_many_leaves_nothing(real: Any, redis_url: str) -> None:
    import asyncio

    import redis.asyncio

    from allocator import AsyncFairAllocator

    pool, raw = real
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)

    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        apool = AsyncFairAllocator(client, pool.name)
        task = asyncio.create_task(apool.acquire_many(2))
        while (await apool.status()).waiting == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.aclose()

    asyncio.run(scenario())
    nothing_waits(pool, raw)
    pool.release(held)
    assert len(pool.acquire_many(2, blocking=False) or []) == 2


@pytest.mark.real_redis
def test_the_cost_script_of_docs_performance_runs() -> None:
    import subprocess
    import sys
    from pathlib import Path

    from allocator._server import find_redis_server

    if find_redis_server() is None:
        pytest.skip("needs redis-server on PATH")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-W", "error", "docs/scripts/many_cost.py", "--n", "20"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(row[0], row[1]) for row in rows] == [
        ("acquire", "1"),
        ("acquire_many", "1"),
        ("acquire_many", "2"),
        ("acquire_many", "8"),
    ]


@pytest.mark.real_redis
def test_a_grant_pushed_to_a_stalled_waiter_is_taken_back_whole(
    real: Any, redis_url: str, pool_name: str, procs: Any
) -> None:
    """The waiter's process is stopped (SIGSTOP) when its grant of two is
    pushed: once its liveness runs out, both leases are taken back and the
    resources serve others; resumed, the waiter queues again and is served
    whole."""
    from _workers import many_leaser

    pool, raw = real
    pool.extend(["a", "b"])
    held = pool.acquire_many(2, timeout=5)
    waiter = procs(many_leaser, redis_url, pool_name, 2, wait_go=True)
    waiter.expect("ready")
    waiter.send("go")
    queued(pool, 1)
    waiter.pause()
    try:
        for lease in held:
            pool.release(lease)
        assert shape(pool) == (0, 2, 0)  # granted and pushed, not picked up
        # status() writes nothing: a gc (any writer) runs the pick-up checks.
        wait_until(
            lambda: pool.gc() is not None and shape(pool) == (2, 0, 0),
            timeout=30,
            what="both taken back",
        )
        other = pool.acquire_many(2, blocking=False)
        assert other is not None
        for lease in other:
            pool.release(lease)
    finally:
        waiter.resume()
    leases = waiter.expect("granted", timeout=30)
    assert {lease.resource for lease in leases} == {"a", "b"}
    waiter.send("release")
    assert waiter.expect("released") == [True, True]
    nothing_waits(pool, raw)


@pytest.mark.real_redis
def test_take_back_of_a_multi_grant_is_whole_even_one_check_at_a_time(
    real: Any, redis_url: str, pool_name: str, procs: Any
) -> None:
    """One script run that handles a single pick-up check (a gc step of
    count 1) still takes back every lease of the grant, not one of three."""
    from _workers import many_leaser

    from allocator._core.steps import Call

    pool, raw = real
    pool.extend(["a", "b", "c"])
    held = pool.acquire_many(3, timeout=5)
    waiter = procs(many_leaser, redis_url, pool_name, 3, wait_go=True)
    waiter.expect("ready")
    waiter.send("go")
    queued(pool, 1)
    waiter.pause()
    for lease in held:
        pool.release(lease)
    keys = pool._pool.keys
    exp, alive, pick = keys[7], keys[10], keys[12]
    assert raw.zcard(exp) == raw.zcard(pick) == 3  # pushed, not picked up
    marks = raw.zrange(alive, 0, -1, withscores=True) + raw.zrange(pick, 0, -1, withscores=True)
    due = max(score for _, score in marks)
    wait_until(lambda: server_now(raw) * 1000 > due + 1, timeout=30, what="liveness ran out")
    # Plain reads until here: no script ran the checks. Now one, of one entry.
    step = Call("gc", keys, ("0", "", "", 1), lambda reply: reply)
    pool._drive(pool._pool._single(step))
    assert raw.zcard(exp) == 0 and raw.zcard(pick) == 0
    assert shape(pool) == (3, 0, 0)
    waiter.resume()
    leases = waiter.expect("granted", timeout=30)
    assert len(leases) == 3
    waiter.send("release")
    assert waiter.expect("released") == [True, True, True]
    nothing_waits(pool, raw)


def test_the_largest_count_runs(factory: Any, pool_name: str) -> None:
    from allocator._core.checks import MAX_COUNT

    pool = factory.pool(pool_name)
    pool.extend([f"r{i}" for i in range(MAX_COUNT)])
    leases = pool.acquire_many(MAX_COUNT, timeout=30)
    assert len({lease.resource for lease in leases}) == MAX_COUNT
    assert pool.status().leased == MAX_COUNT
    with pytest.raises(AcquireTimeout):
        pool.acquire_many(MAX_COUNT, timeout=0.1)  # queues, cancels: O(count) each
    for lease in leases:
        pool.release(lease)
    assert pool.status().free == MAX_COUNT


def test_a_retried_acquire_many_keeps_its_place_and_its_grant(pool: Any, raw: Any) -> None:
    """A reply lost and the call sent again (same request id): the request
    is queued once, and a grant is handed over again, not made twice."""
    inner = getattr(pool, "inner", pool)
    if inner is not pool:
        pytest.skip("drives the sync shell's steps")
    q, _exp, meta = queue_keys(pool)
    pool.extend(["a", "b", "c"])
    held = pool.acquire_many(3, timeout=5)
    reader = pool._reader()
    flow = pool._pool.acquire_many(2, 30, None, True, cid=reader.cid_for(pool._pool))
    enqueue = flow.steps.send(None)
    first = enqueue.parse(pool._step(enqueue))
    again = enqueue.parse(pool._step(enqueue))
    assert isinstance(first, tuple) and isinstance(again, tuple)
    assert first[0] == again[0]  # queued once: the same ticket
    assert pool.status().waiting == 1 and int(raw.hget(meta, "xw")) == 1
    assert raw.xlen(q) == 2  # the request and its place-holder
    pool.release(held[0])
    pool.release(held[1])  # granted and pushed to the (idle) waiter
    status = pool.status()
    assert (status.leased, status.waiting) == (3, 0)
    granted = enqueue.parse(pool._step(enqueue))
    regranted = enqueue.parse(pool._step(enqueue))
    assert isinstance(granted, list) and len(granted) == 2
    assert [lease.token for lease in granted] == [lease.token for lease in regranted]
    assert pool.status().leased == 3
    flow.steps.close()
    for lease in (*granted, held[2]):
        assert pool.release(lease) is True
    nothing_waits(pool, raw)


@pytest.mark.real_redis
def test_stream_deleted_under_a_waiting_multi_request(real: Any) -> None:
    pool, raw = real
    q, _exp, meta = queue_keys(pool)
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)
    waiter = Background(lambda: pool.acquire_many(2, timeout=60))
    queued(pool, 1)
    raw.delete(q)  # the stream, with the lease's ticket and the request's
    pool.release(held)  # False or True: the lease's ticket is gone
    got = waiter.join(60)  # it notices, queues again and is served
    assert len(got) == 2
    for lease in got:
        pool.release(lease)
    pool.gc()
    nothing_waits(pool, raw)
    assert raw.hget(meta, "xw") is None


def test_a_multi_request_is_woken_when_rate_budgets_free(pool: Any) -> None:
    # A window that no scheduling delay on a loaded machine outlasts between
    # the releases and the status below.
    pool.extend(["a", "b"], rate=(1, 2.0))
    first = pool.acquire_many(2, timeout=5)
    for lease in first:
        pool.release(lease)
    assert pool.status().free == 0  # both out of budget for 2 s
    again = pool.acquire_many(2, timeout=10)  # served once the budgets free
    assert {lease.resource for lease in again} == {"a", "b"}
    assert again[0].granted_at >= first[0].granted_at + 2.0  # the budget was kept


def test_a_pool_that_shrank_below_count_holds_the_request_until_extend(pool: Any) -> None:
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)
    waiter = Background(lambda: pool.acquire_many(2, timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="the multi request queued")
    assert pool.remove([r for r in ("a", "b") if r != held.resource]) == 1
    pool.release(held)
    status = pool.status()
    assert (status.size, status.free, status.waiting) == (1, 1, 1)  # it waits
    assert pool.acquire(blocking=False) is None  # and nobody passes it
    pool.extend(["c"])
    got = waiter.join()
    assert {lease.resource for lease in got} == {held.resource, "c"}


def test_every_lease_of_a_multi_grant_shows_its_owner_and_counts_as_a_grant(pool: Any) -> None:
    pool.extend(["a", "b", "c"])
    leases = pool.acquire_many(2, timeout=5, owner="trainer-1")
    shown = sorted((info.resource, info.token, info.owner) for info in pool.leases())
    assert shown == sorted((lease.resource, lease.token, "trainer-1") for lease in leases)
    assert pool.stats().grants == 2
    with pool.lease_many(1, timeout=5, owner="evaluator") as (one,):
        assert {i.owner for i in pool.leases() if i.resource == one.resource} == {"evaluator"}
    for lease in leases:
        pool.release(lease)
    assert pool.leases() == ()


@pytest.mark.real_redis
@pytest.mark.replicas
def test_acquire_many_with_min_replicas(pool_name: str) -> None:
    """Every lease confirmed (in the reply, or pushed); with the replica
    down, NotReplicated and nothing left behind."""
    from _replication import Replicated

    from allocator import FairAllocator, NotReplicated

    with Replicated(replicas=1) as made:
        plain = FairAllocator(made.client(), pool_name)
        plain.extend(["a", "b", "c"])
        sure = FairAllocator(made.client(), pool_name, min_replicas=1, replica_timeout=5.0)
        replica = made.client(made.replicas[0], decode_responses=True)
        recs = sure._pool.keys[6]
        leases = sure.acquire_many(2, timeout=5)  # granted in the reply
        assert all(replica.hexists(recs, lease.id) for lease in leases)
        for lease in leases:
            assert sure.release(lease)
        held = plain.acquire_many(3, timeout=5)
        waiter = Background(lambda: sure.acquire_many(2, timeout=30))
        wait_until(lambda: plain.status().waiting == 1, what="the request queued")
        for lease in held:
            plain.release(lease)  # pushed to the waiter, confirmed by it
        pushed = waiter.join(30)
        assert all(replica.hexists(recs, lease.id) for lease in pushed)
        for lease in pushed:
            assert sure.release(lease)
        made.stop_replica()
        hurried = FairAllocator(made.client(), pool_name, min_replicas=1, replica_timeout=0.3)
        with pytest.raises(NotReplicated):
            hurried.acquire_many(2, timeout=5)
        status = plain.status()
        assert (status.free, status.leased, status.waiting) == (3, 0, 0)
        replica.close()
