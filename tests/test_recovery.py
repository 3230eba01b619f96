"""Recovery from crashes, pauses and restarts (docs/concepts.md#4-liveness,
docs/operations.md#restarts-and-failover), with real processes.

Every scenario runs against a real Redis, with the pool's clients in separate
OS processes (``tests/_workers.py``) that are SIGKILLed or SIGSTOPped for
real. Events are ordered with the workers' report queues and with the pool's
own queue length, never with sleeps; the only sleeps are the durations a
scenario is about (a waiter that waits longer than the liveness window, a
lease kept past several ttls, a server that comes up late).

While a scenario waits for the pool to recover by itself, the test runs no
script on the pool (``status()`` and ``gc()`` reclaim too, and would hide a
pool that cannot recover without them): it only reads the server clock.

The measured recovery times (holder death -> next grant, dead waiters -> next
grant) are printed (``pytest -s``) and written to ``recovery_times.json`` in
the pytest temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import redis
from _workers import Proc, first_report, gc_loop, lease_block, leaser, server_now
from helpers import Background, wait_until

from allocator import AsyncFairAllocator, FairAllocator, Lease, LeaseLost
from allocator._core.keys import KEY_SUFFIXES
from allocator._core.liveness import ALIVE
from allocator._core.presence import GRACE
from allocator._server import RedisServer

pytestmark = pytest.mark.real_redis

#: Positions of the pool's keys (lua/README.md), to damage them by hand.
KEY = {suffix: i for i, suffix in enumerate(KEY_SUFFIXES)}

#: Slack on every recovery bound: generous, these are correctness bounds
#: (the pool recovers at all, and in about the time it promises), not speed.
SLACK = 10.0


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def recovery_times(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[float]]]:
    times: dict[str, list[float]] = {}
    yield times
    path = Path(tmp_path_factory.getbasetemp()) / "recovery_times.json"
    path.write_text(json.dumps(times, indent=2, sort_keys=True), encoding="utf-8")
    print(f"\nrecovery times (s): {json.dumps(times, sort_keys=True)}\nwritten to {path}")


def record(times: dict[str, list[float]], what: str, seconds: float) -> None:
    times.setdefault(what, []).append(round(seconds, 3))
    print(f"\n[recovery] {what}: {seconds:.3f} s")


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


def pool_keys(client: Any, name: str) -> list[str]:
    """Every key of the pool (they all carry its hash tag)."""
    return sorted(k.decode() for k in client.scan_iter(match=f"*{{{name}}}*", count=1000))


def queue_in_order(pool: FairAllocator, workers: list[Proc], already: int = 0) -> None:
    """Let ``workers`` (started with ``wait_go``) acquire one after the other,
    each only once the one before is in the queue: their tickets are in
    this order."""
    for worker in workers:
        worker.expect("ready")
    for count, worker in enumerate(workers, start=already + 1):
        worker.send("go")
        wait_until(lambda: pool.status().waiting == count, what=f"{count} waiting")  # noqa: B023


# -- 11. dead holders ------------------------------------------------------------------


def hold(procs: Callable[..., Proc], *args: Any, **kwargs: Any) -> tuple[Proc, Lease]:
    """A holder process (``leaser``) that has leased a resource of the pool."""
    holder = procs(leaser, *args, **kwargs)
    holder.expect("ready")
    held: Lease = holder.expect("granted")
    return holder, held


@pytest.mark.parametrize("gc_job", [False, True], ids=["waiters-only", "with-gc-loop"])
def test_dead_holder_is_reclaimed_by_the_next_waiter(
    redis_url: str,
    pool_name: str,
    client: Any,
    procs: Callable[..., Proc],
    recovery_times: dict[str, list[float]],
    gc_job: bool,
) -> None:
    ttl = 2.0
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    # The waiter and the gc loop are started before the holder's short
    # lease begins: on a loaded machine (the suite's xdist workers side by
    # side) starting a process can take longer than the ttl, and the lease
    # would run out before the waiter queued behind it.
    collector = None
    if gc_job:
        collector = procs(gc_loop, redis_url, pool_name, every=0.1)
        collector.expect("ready")
    waiter = procs(leaser, redis_url, pool_name, ttl=30.0, wait_go=True)
    waiter.expect("ready")
    holder, held = hold(procs, redis_url, pool_name, ttl=ttl)
    waiter.send("go")
    wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")

    holder.kill()
    killed_at = server_now(client)
    # From here on the test runs nothing on the pool: the waiter (and in the
    # second variant the gc loop) must reclaim the dead holder's lease.
    got: Lease = waiter.expect("granted", timeout=ttl + SLACK)
    assert got.resource == "r"
    assert got.token > held.token
    # Never granted again before the dead holder's deadline (server clock).
    assert got.granted_at >= held.expires_at
    assert got.granted_at - killed_at <= ttl + SLACK
    label = "with gc loop" if gc_job else "waiters only"
    record(recovery_times, f"holder death -> next grant ({label}, ttl {ttl:g} s)",
           got.granted_at - killed_at)  # fmt: skip
    record(recovery_times, f"lease deadline -> next grant ({label})",
           got.granted_at - held.expires_at)  # fmt: skip
    waiter.send("release")
    assert waiter.expect("released") is True
    if collector is not None:
        collector.send("stop")
        runs, _reclaimed = collector.until("stopped")
        assert runs >= 1
    status = pool.status()
    assert (status.size, status.free, status.leased, status.waiting) == (1, 1, 0, 0)


def test_dead_holder_with_nobody_waiting_is_reclaimed_by_gc(
    redis_url: str,
    pool_name: str,
    client: Any,
    procs: Callable[..., Proc],
    recovery_times: dict[str, list[float]],
) -> None:
    ttl = 2.0
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    holder, held = hold(procs, redis_url, pool_name, ttl=ttl)
    collector = procs(gc_loop, redis_url, pool_name, every=0.2)
    collector.expect("ready")
    holder.kill()
    killed_at = server_now(client)
    count, reclaimed_at = collector.expect("reclaimed", timeout=ttl + SLACK)
    assert count == 1
    assert reclaimed_at >= held.expires_at
    assert reclaimed_at - killed_at <= ttl + SLACK
    record(recovery_times, "holder death -> reclaimed by a gc loop (no waiter, every 0.2 s)",
           reclaimed_at - killed_at)  # fmt: skip
    collector.send("stop")
    collector.until("stopped")
    again = pool.acquire(blocking=False)
    assert again is not None and again.token > held.token
    assert pool.release(again) is True


def test_a_renew_of_a_lease_past_its_deadline_serves_the_queue(pool_name: str, client: Any) -> None:
    """A renew does no maintenance (lua/renew.lua): another holder's renew
    after a lease ran out touches neither that lease nor anybody's grant
    (the waiter's own look reclaims it). The renew of the lease that ran
    out ends it, and hands its resource to the queue head at once (pushed
    to its client)."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)
    late = pool.acquire(timeout=5)
    cid = "renew-test-client"
    flow = pool._pool.acquire(None, None, None, True, cid=cid)
    step = flow.steps.send(None)  # the acquire: nothing is free, it queues
    flow.steps.send(pool._step(step))  # now it would wait for its grant
    signal = pool._pool.signal_key(cid)
    # The other lease runs out only now, with the waiter in line.
    late = pool.renew(late, ttl=0.05)
    wait_until(lambda: server_now(client) > late.expires_at + 0.005, what="the lease's deadline")
    pool.renew(held)
    assert client.llen(signal) == 0
    with pytest.raises(LeaseLost):
        pool.renew(late)
    pushed = [m.decode() if isinstance(m, bytes) else m for m in client.lrange(signal, 0, -1)]
    assert [m.split("|")[:2] for m in pushed] == [["g", flow.lid]]
    assert pushed[0].endswith(f"|{late.resource}")
    flow.steps.close()


def test_several_holders_dying_in_a_row(
    redis_url: str,
    pool_name: str,
    client: Any,
    procs: Callable[..., Proc],
    recovery_times: dict[str, list[float]],
) -> None:
    ttl = 1.5
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    first = pool.acquire(timeout=5, ttl=60)
    doomed = [procs(leaser, redis_url, pool_name, ttl=ttl, wait_go=True) for _ in range(3)]
    survivor = procs(leaser, redis_url, pool_name, ttl=60.0, wait_go=True)
    queue_in_order(pool, [*doomed, survivor])

    assert pool.release(first) is True
    previous, killed_at = first, None
    for victim in doomed:
        # Each one is served in its turn, after the one before died and its
        # lease ran out, and dies holding the resource.
        got: Lease = victim.expect("granted", timeout=ttl + SLACK)
        assert got.token > previous.token
        if killed_at is not None:
            assert got.granted_at >= previous.expires_at
            record(recovery_times, f"holder death -> next grant (in a row, ttl {ttl:g} s)",
                   got.granted_at - killed_at)  # fmt: skip
        victim.kill()
        previous, killed_at = got, server_now(client)
    last: Lease = survivor.expect("granted", timeout=ttl + SLACK)
    assert last.token > previous.token and last.granted_at >= previous.expires_at
    assert killed_at is not None
    record(recovery_times, f"holder death -> next grant (in a row, ttl {ttl:g} s)",
           last.granted_at - killed_at)  # fmt: skip
    survivor.send("release")
    assert survivor.expect("released") is True
    assert pool.status().free == 1


# -- 12. dead waiters ahead of a live one ------------------------------------------------


def test_dead_waiters_at_the_head_hold_up_a_live_one_for_seconds_not_ttls(
    redis_url: str,
    pool_name: str,
    client: Any,
    procs: Callable[..., Proc],
    recovery_times: dict[str, list[float]],
) -> None:
    ttl = 30.0  # a lease ttl: what a waiter that died must never cost
    pool = FairAllocator(client, pool_name, lease_ttl=ttl)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    dead = [procs(leaser, redis_url, pool_name, ttl=ttl, wait_go=True) for _ in range(3)]
    live = procs(leaser, redis_url, pool_name, ttl=ttl, wait_go=True)
    queue_in_order(pool, [*dead, live])
    for waiter in dead:
        waiter.kill()

    released_at = server_now(client)
    assert pool.release(held) is True
    # Nothing else runs on the pool: the live waiter's own heartbeats must
    # get the dead ones out of its way.
    got: Lease = live.expect("granted", timeout=3 * ttl)
    waited = got.granted_at - released_at
    record(recovery_times, "3 dead waiters at the head -> live waiter granted", waited)
    # A few seconds (liveness window + pick-up window), never a lease ttl.
    assert waited <= ALIVE + 2.0 + SLACK < ttl
    live.send("release")
    assert live.expect("released") is True
    pool.gc()
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)
    # 17, 19: nothing of the dead waiters is left behind (no signal list, no
    # ticket), and no key of the pool has a TTL a volatile-* policy could
    # evict it by.
    keys = pool_keys(client, pool_name)
    assert pool._pool.keys[KEY["res"]] in keys
    assert not [k for k in keys if ":s:" in k], keys
    assert client.xlen(pool._pool.keys[KEY["q"]]) == 0
    assert all(client.ttl(k) == -1 for k in keys), {k: client.ttl(k) for k in keys}


# -- 13. a live waiter that waits longer than the liveness window ---------------------


def test_a_long_wait_keeps_its_place(
    redis_url: str, pool_name: str, client: Any, procs: Callable[..., Proc]
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5, ttl=60)
    early = procs(leaser, redis_url, pool_name, wait_go=True)
    late = procs(leaser, redis_url, pool_name, wait_go=True)
    queue_in_order(pool, [early])
    # The duration is the point here: well past the liveness window.
    time.sleep(ALIVE + 3.0)
    queue_in_order(pool, [late], already=1)
    assert pool.gc().dropped_waiters == 0
    assert pool.status().waiting == 2

    assert pool.release(held) is True
    # One resource: if the late waiter had passed the early one, the early
    # one would never be granted while the late one holds it.
    first: Lease = early.expect("granted", timeout=SLACK)
    early.send("release")
    assert early.expect("released") is True
    second: Lease = late.expect("granted", timeout=SLACK)
    assert held.token < first.token < second.token
    late.send("release")
    assert late.expect("released") is True


# -- 20. a holder paused past its lease ---------------------------------------------------


def test_a_paused_holder_learns_it_lost_the_lease(
    redis_url: str,
    pool_name: str,
    client: Any,
    procs: Callable[..., Proc],
    recovery_times: dict[str, list[float]],
) -> None:
    ttl = 2.0
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    holder, held = hold(procs, redis_url, pool_name, ttl=ttl)
    holder.send(("renew_every", ttl / 6))  # a diligent holder, renewing all along
    successor = procs(leaser, redis_url, pool_name, ttl=30.0)
    successor.expect("ready")
    wait_until(lambda: pool.status().waiting == 1, what="the successor queued")

    holder.pause()  # a GC pause, a stopped VM: it cannot renew
    paused_at = server_now(client)
    try:
        got: Lease = successor.expect("granted", timeout=ttl + SLACK)
    finally:
        holder.resume()
    record(recovery_times, f"holder paused -> next grant (ttl {ttl:g} s)",
           got.granted_at - paused_at)  # fmt: skip
    # Its next renewal fails, and so does its release.
    assert holder.expect("lost") == held.token
    assert holder.expect("released") is False
    assert got.token > held.token
    successor.send("release")
    assert successor.expect("released") is True


# -- remove(force=True) under a holder in another process --------------------------------


def test_forced_remove_makes_the_holders_block_exit_raise(
    redis_url: str, pool_name: str, client: Any, procs: Callable[..., Proc]
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    holder = procs(lease_block, redis_url, pool_name)
    holder.expect("ready")
    held: Lease = holder.expect("granted")
    assert pool.remove(["r"], force=True) == 1
    holder.send("leave")
    assert holder.expect("exit") == "LeaseLost"
    assert pool.status().size == 0
    pool.extend(["r"])
    again = pool.acquire(timeout=5)
    assert again.token > held.token
    assert pool.release(again) is True


# -- 18. server restarts -------------------------------------------------------------------


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_restart_with_appendonly_keeps_leases_and_queue_order(
    pool_name: str, procs: Callable[..., Proc], kill: bool
) -> None:
    with RedisServer(appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        pool = FairAllocator(client, pool_name)
        pool.extend(["r"])
        # Its lease ends once its presence is gone for the grace: the
        # restart drops it, and it must come back in time. The server stays
        # down for longer than the grace: it cannot count the time it is
        # down against anybody.
        holder, held = hold(procs, server.url, pool_name, ttl=60.0, reclaim=True)
        waiters = [procs(leaser, server.url, pool_name, wait_go=True) for _ in range(3)]
        queue_in_order(pool, waiters)

        server.stop(kill=kill)
        down = time.monotonic()
        wait_until(lambda: time.monotonic() > down + 2 * GRACE, what="down for two graces")
        server.start()
        back = server_now(client)
        wait_until(lambda: server_now(client) > back + 2.0, what="a grace and its checks")
        assert [info.holder_present for info in pool.leases()] == [True]

        holder.send("renew")
        renewed: Lease = holder.expect("renewed")
        assert renewed.token == held.token and renewed.expires_at >= held.expires_at
        assert pool.status().waiting == 3
        holder.send("release")
        assert holder.expect("released") is True
        tokens = [held.token]
        for waiter in waiters:  # in their original order
            got: Lease = waiter.expect("granted", timeout=SLACK)
            tokens.append(got.token)
            waiter.send("release")
            assert waiter.expect("released") is True
        assert tokens == sorted(set(tokens))
        client.close()


def test_restart_without_persistence_loses_leases_but_never_repeats_tokens(
    pool_name: str, procs: Callable[..., Proc]
) -> None:
    with RedisServer(appendonly=False) as server:
        client = redis.Redis.from_url(server.url)
        pool = FairAllocator(client, pool_name)
        pool.extend(["r"])
        before = []
        for _ in range(3):  # some history, so that the fence has moved
            lease = pool.acquire(timeout=5)
            before.append(lease.token)
            pool.release(lease)
        holder, held = hold(procs, server.url, pool_name, ttl=60.0)
        before.append(held.token)
        waiters = [procs(leaser, server.url, pool_name, wait_go=True) for _ in range(2)]
        queue_in_order(pool, waiters)

        server.restart()  # every key is gone

        holder.send("renew")
        assert holder.expect("lost") == held.token
        holder.send("release")
        assert holder.expect("released") is False
        pool.extend(["r"])  # the application sets its pool up again at start
        # The waiters' tickets vanished; they queue again and are served.
        pending = list(waiters)
        while pending:
            waiter, got = first_report(pending, "granted", timeout=3 * SLACK)
            assert got.token > max(before)
            before.append(got.token)
            waiter.send("release")
            assert waiter.expect("released") is True
            pending.remove(waiter)
        status = pool.status()
        assert (status.size, status.free, status.leased, status.waiting) == (1, 1, 0, 0)
        client.close()


def test_tokens_never_repeat_after_a_failover_that_lost_writes(pool_name: str, client: Any) -> None:
    """A replica that lagged is promoted: the pool's keys go back to an older
    state. Grants made after that must carry tokens above every token
    granted before, the lost ones included."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r", "s"])
    warmup = pool.acquire(timeout=5)
    pool.release(warmup)
    keys = pool._pool.keys[: len(KEY_SUFFIXES)]
    snapshot = {key: client.dump(key) for key in keys}
    granted = [warmup.token]
    for _ in range(5):  # the writes the failover loses
        lease = pool.acquire(timeout=5)
        granted.append(lease.token)
        pool.release(lease)
    kept = pool.acquire(timeout=5)  # a holder whose lease the failover loses
    granted.append(kept.token)
    for key, dumped in snapshot.items():  # back to the old state
        client.delete(key)
        if dumped is not None:
            client.restore(key, 0, dumped)
    for _ in range(3):
        lease = pool.acquire(timeout=5)
        assert lease.token > max(granted), (lease.resource, lease.token)
        granted.append(lease.token)
        pool.release(lease)
    with pytest.raises(LeaseLost):
        pool.renew(kept)


def test_a_client_started_before_the_server_waits_for_it(
    pool_name: str, procs: Callable[..., Proc]
) -> None:
    server = RedisServer()  # its port is chosen, nothing listens on it yet
    try:
        waiter = procs(leaser, server.url, pool_name, timeout=40.0)
        waiter.expect("ready")
        time.sleep(1.0)  # the scenario: the server comes up a second later
        server.start()
        client = redis.Redis.from_url(server.url)
        FairAllocator(client, pool_name).extend(["r"])
        got: Lease = waiter.expect("granted", timeout=45)
        assert got.resource == "r"
        waiter.send("release")
        assert waiter.expect("released") is True
        client.close()
    finally:
        server.close()


# -- 14. the queue as the safety net -------------------------------------------------


def test_gc_reclaims_an_expired_lease_through_the_queue(pool_name: str, client: Any) -> None:
    """Its deadline entry is gone (lost, or a bug): gc's walk of the queue,
    where a ticket stays as long as its lease, still finds the lease and
    ends it once it is past due."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    lost = pool.acquire(timeout=5, ttl=0.2)
    client.delete(pool._pool.keys[KEY["exp"]])
    wait_until(lambda: server_now(client) > lost.expires_at + 0.01, what="the deadline")
    assert pool.gc().reclaimed == 1
    assert pool.release(lost) is False
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)


def test_gc_deletes_a_granted_ticket_whose_lease_is_gone(pool_name: str, client: Any) -> None:
    """A lease whose record, deadline and index entry were deleted (by
    hand, or a bug): gc sets its resource right. And a lease's ticket that
    an earlier version kept in the queue for as long as the lease: gc
    deletes it (an orphan) and leaves the lease alone."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r", "s"])
    gone = pool.acquire(timeout=5)
    kept = pool.acquire(timeout=5)
    keys = pool._pool.keys
    recs, q = keys[KEY["recs"]], keys[KEY["q"]]
    client.hdel(recs, gone.id)
    client.zrem(keys[KEY["exp"]], gone.id)
    client.zrem(keys[KEY["held"]], f"{gone.resource}\0{gone.id}")
    old = client.xadd(q, {"l": kept.id, "c": "cid-old", "t": "60000", "o": "me"})
    client.hset(recs, kept.id, client.hget(recs, kept.id).replace(kept.ticket.encode(), old, 1))
    kept = attrs.evolve(kept, ticket=old.decode())
    assert client.xlen(q) == 1
    report = pool.gc()
    assert report.orphans == 1 and report.repaired >= 1
    assert client.xlen(q) == 0
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 1, 0)
    assert pool.renew(kept).ticket == kept.ticket
    assert pool.release(kept) is True
    assert pool.release(pool.acquire(timeout=5)) is True


def test_a_lease_whose_ticket_was_deleted_is_left_alone(pool_name: str, client: Any) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r", "s"])
    first, second = pool.acquire(timeout=5), pool.acquire(timeout=5)
    client.xdel(pool._pool.keys[KEY["q"]], first.ticket)
    pool.gc()  # the walk of the queue does not meet it
    assert pool.renew(first).token == first.token
    assert pool.status().leased == 2
    assert pool.release(first) is True and pool.release(second) is True
    pool.gc()
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (2, 0, 0)


# -- 15. client defaults: socket timeouts shorter than a wait -----------------------


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_wait_longer_than_the_socket_timeout(
    redis_url: str, pool_name: str, client: Any, flavour: str
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    socket_timeout = 0.3
    waited = 4 * socket_timeout

    if flavour == "sync":
        short = redis.Redis.from_url(redis_url, socket_timeout=socket_timeout)
        other = FairAllocator(short, pool_name)
        waiter = Background(lambda: other.acquire(timeout=30))
        wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")
        time.sleep(waited)  # the duration is the point: several socket timeouts
        assert pool.release(held) is True
        got = waiter.join(30)
        assert other.release(got) is True
        short.close()
        return

    async def scenario() -> None:
        short = redis.asyncio.Redis.from_url(redis_url, socket_timeout=socket_timeout)
        other = AsyncFairAllocator(short, pool_name)
        task = asyncio.ensure_future(other.acquire(timeout=30))
        while pool.status().waiting != 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(waited)
        assert pool.release(held) is True
        got = await asyncio.wait_for(task, 30)
        assert await other.release(got) is True
        await short.aclose()

    asyncio.run(scenario())


# -- 16. many waiters in one process --------------------------------------------------


def test_many_async_waiters_share_a_small_connection_pool(
    redis_url: str, pool_name: str, client: Any
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    count = 40

    async def scenario() -> list[int]:
        small = redis.asyncio.Redis.from_url(redis_url, max_connections=4)
        apool = AsyncFairAllocator(small, pool_name)
        order: list[int] = []

        async def one(i: int) -> None:
            lease = await apool.acquire(timeout=60)
            order.append(i)
            assert await apool.release(lease) is True

        tasks = []
        for i in range(count):
            tasks.append(asyncio.ensure_future(one(i)))
            while pool.status().waiting != i + 1:
                await asyncio.sleep(0.005)
        assert pool.release(held) is True
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        await small.aclose()
        return order

    # Served in the order they queued, none of them starved of a connection.
    assert asyncio.run(scenario()) == list(range(count))
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)


# -- 17. the stream or its group deleted under the pool -----------------------------


def test_waiters_are_served_after_the_stream_was_deleted(
    redis_url: str, pool_name: str, client: Any, procs: Callable[..., Proc]
) -> None:
    """The queue's stream vanishes (deleted by hand, evicted): a requester that
    was waiting must not wait for ever while the resource is free."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = procs(leaser, redis_url, pool_name, timeout=40.0)
    waiter.expect("ready")
    wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")
    client.delete(pool._pool.keys[KEY["q"]])
    assert pool.release(held) is True
    pool.gc()
    got: Lease = waiter.expect("granted", timeout=SLACK)
    assert got.token > held.token
    waiter.send("release")
    assert waiter.expect("released") is True


def test_a_consumer_group_an_older_version_left_on_the_queue_changes_nothing(
    redis_url: str, pool_name: str, client: Any, procs: Callable[..., Proc]
) -> None:
    """Earlier versions kept granted tickets in a consumer group of the
    queue (`g`, read with XCLAIM and XAUTOCLAIM). A pool they left with one,
    every ticket in its pending list, is served in order and collected as
    any other; the group is not read."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiters = [procs(leaser, redis_url, pool_name, wait_go=True) for _ in range(3)]
    queue_in_order(pool, waiters)
    stream = pool._pool.keys[KEY["q"]]
    client.xgroup_create(stream, "g", id="0")
    client.xreadgroup("g", "d", {stream: ">"})  # every ticket pending
    assert pool.release(held) is True
    tokens = [held.token]
    for waiter in waiters:
        got: Lease = waiter.expect("granted", timeout=SLACK)
        tokens.append(got.token)
        waiter.send("release")
        assert waiter.expect("released") is True
    assert tokens == sorted(set(tokens))
    assert pool.gc().orphans == 0
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)
    assert client.xlen(stream) == 0


# -- keepalive --------------------------------------------------------------------------------


def test_keepalive_keeps_a_lease_past_several_ttls_and_leaks_no_thread(
    redis_url: str, pool_name: str, client: Any
) -> None:
    ttl = 1.5
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    other_client = redis.Redis.from_url(redis_url)
    other = FairAllocator(other_client, pool_name)
    before = set(threading.enumerate())
    with pool.lease(timeout=5, ttl=ttl, keepalive=True) as held:
        assert set(threading.enumerate()) - before, "no keepalive thread was started"
        # The duration is the point: three ttls past the first deadline.
        wait_until(lambda: server_now(client) > held.expires_at + 3 * ttl, timeout=30,
                   what="three ttls")  # fmt: skip
        assert other.acquire(blocking=False) is None
        status = pool.status()
        assert (status.leased, status.free) == (1, 0)
    # The keepalive's thread ended with the block; the client's presence
    # watch stays a while (a worker that leases again keeps it), until
    # close() or a few seconds with nothing held.
    leaked = {t for t in set(threading.enumerate()) - before if t.name != "allocator-presence"}
    assert not leaked, f"threads left behind: {leaked}"
    pool.close()
    wait_until(lambda: not set(threading.enumerate()) - before, what="the presence watch ended")
    again = other.acquire(blocking=False)
    assert again is not None and again.token > held.token
    assert other.release(again) is True
    other_client.close()


# -- 19. maxmemory-policy ------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-random", "volatile-lru", "noeviction"])
def test_evicting_maxmemory_policy_warns(pool_name: str, policy: str) -> None:
    """Only allkeys-* can evict the pool's keys (none has a TTL): one warning
    per allocator for those, none otherwise."""
    with RedisServer(extra_args=["--maxmemory", "64mb", "--maxmemory-policy", policy]) as server:
        client = redis.Redis.from_url(server.url)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pool = FairAllocator(client, pool_name)
            pool.extend(["r"])
            lease = pool.acquire(timeout=5)
            pool.release(lease)
            pool.status()
            pool.gc()
        client.close()
    about = [w for w in caught if "maxmemory" in str(w.message)]
    if policy.startswith("allkeys"):
        assert len(about) == 1, [str(w.message) for w in about]
        assert about[0].category is RuntimeWarning and policy in str(about[0].message)
    else:
        assert not about, [str(w.message) for w in about]
