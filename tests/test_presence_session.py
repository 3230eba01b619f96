"""Presence as a session (docs/concepts.md, "Presence as a session"): an
absence is one absence, without a break, from the client's last confirmed
return, so a presence connection that drops and comes back again and again
fools nobody. A reclaimable holder always knows it lost its lease before
anybody else is granted it; a waiter keeps its place.

The presence is taken down from outside at fixed periods, for most of
each period, and let come back for the rest (tests/_workers.py,
``Flapper``: the client's channel permissions revoked and given back, so
that the server drops its presence connection and refuses it until then);
everything else of the clients works on. Each absence is shorter than the
grace; a server that sampled presence, a grace apart, would still find two
absences and take them for one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from _workers import (
    Flapper,
    Proc,
    crowd,
    flapped_url,
    server_now,
    timed_waiter,
    watching_holder,
)
from helpers import LoopThread, wait_until

from allocator import AsyncFairAllocator, FairAllocator
from allocator._core.presence import GRACE, HEARTBEAT_PRESENT
from allocator.cli.bench.waiters import commands_per_second

#: How long each trial flaps the connections: several graces.
FLAP = 3.0 * GRACE
#: What the clock bounds below allow beyond those of docs/concepts.md: a
#: loaded 2-core machine's scheduling.
SLACK = 1.0


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    made = redis.Redis.from_url(redis_url, decode_responses=True)
    yield made
    made.close()


def presences(client: Any, prefix: str) -> int:
    return sum(
        1
        for c in client.client_list()
        if c.get("name", "").startswith(prefix)
        and int(c.get("ssub", 0) or 0) + int(c.get("sub", 0) or 0) > 0
    )


@pytest.mark.real_redis
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "asyncio"])
@pytest.mark.parametrize("period", [0.05, 0.1, 0.3, 0.6])
def test_a_flapping_holder_knows_first(
    redis_url: str,
    client: Any,
    pool_name: str,
    procs: Callable[..., Proc],
    period: float,
    aio: bool,
) -> None:
    """A reclaimable holder that works and renews (``keepalive=True``)
    while its presence connection alone is down for most of every
    ``period`` seconds for several graces, with a waiter queued behind it. Before presence
    was a session, the server's samples a grace apart both found it absent
    and granted its lease to the waiter while the holder still believed it
    held (50 ms: 5 trials of 5; 600 ms: 14 of 20). Now, in every trial:
    if the waiter is granted the resource, the holder knew it had lost it
    before the waiter's acquire returned."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    url = flapped_url(redis_url, client, "holder")
    holder = procs(watching_holder, url, pool_name, client_name="holder", aio=aio)
    lease = holder.expect("granted", timeout=15)
    wait_until(lambda: presences(client, "holder") == 1, what="the holder's presence")
    waiter = procs(timed_waiter, redis_url, pool_name, client_name="waiter")
    waiter.expect("ready")
    waiter.send("go")
    wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")
    with Flapper(redis_url, "holder", period) as flapper:
        deadline = _monotonic() + FLAP
        wait_until(lambda: _monotonic() > deadline, timeout=FLAP + 5, what="flapping")
    assert flapper.flaps >= 3
    lost_at = None
    report = holder.poll()
    if report is not None:
        assert report[0] == "lost"
        lost_at = report[1]
    granted = waiter.poll()
    if granted is not None:
        assert granted[0] == "granted"
        got, returned_at = granted[1]
        assert got.token > lease.token
        assert lost_at is not None, "the waiter was granted a lease its holder still held"
        assert lost_at < returned_at, "the holder learned of its loss after the next grant"
    # (Every return is confirmed well within the grace, so the holder keeps
    # its lease, unless the machine is so loaded that a return takes over
    # 0.75 s: then it gives the lease up first, which the checks above
    # allow; that is safe, not a failure.)
    holder.send("stop")
    if granted is None:
        got, _ = waiter.expect("granted", timeout=15)
        assert got.token > lease.token
    holder.until("held", timeout=15)
    waiter.send("release")
    assert waiter.expect("released") is True


def _monotonic() -> float:
    return time.monotonic()


@pytest.mark.real_redis
@pytest.mark.parametrize("period", [0.1, 0.5, 1.0])
def test_flapping_waiters_keep_their_places(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc], period: float
) -> None:
    """Four waiters queued in order, every one's presence connection down
    for most of every ``period`` seconds for several graces while the
    resource is held
    (before: FIFO broken in 19 trials of 20 at 100 ms, 8 of 20 at 1 s: a
    waiter judged dead was dropped and queued again at the back). Then the
    resource goes round: it is granted in the order they queued."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiters: list[Proc] = []
    url = flapped_url(redis_url, client, "waiters")
    for i in range(4):
        waiter = procs(timed_waiter, url, pool_name, client_name=f"w{i}")
        waiter.expect("ready")
        waiter.send("go")
        wait_until(lambda i=i: pool.status().waiting == i + 1, what=f"waiter {i} queued")
        waiters.append(waiter)
    wait_until(lambda: presences(client, "w") == 4, what="their presences")
    with Flapper(redis_url, "waiters", period) as flapper:
        deadline = _monotonic() + FLAP
        wait_until(lambda: _monotonic() > deadline, timeout=FLAP + 5, what="flapping")
    assert flapper.flaps >= 3
    assert pool.status().waiting == 4
    assert pool.release(held)
    tokens = []
    for waiter in waiters:
        lease, _ = waiter.expect("granted", timeout=15)
        tokens.append(lease.token)
        waiter.send("release")
        assert waiter.expect("released") is True
    assert tokens == sorted(tokens)
    assert pool.stats().dropped_waiters == 0


def queue_crowds(
    pool: FairAllocator,
    procs: Callable[..., Proc],
    url: str,
    crowds: int,
    clients: int,
    waiters: int,
) -> list[Proc]:
    """``crowds`` processes of ``clients`` clients with ``waiters`` waiters
    each, all queued."""
    made = [procs(crowd, url, pool.name, clients=clients, waiters=waiters) for _ in range(crowds)]
    for proc in made:
        proc.expect("ready")
    total = crowds * clients * waiters
    wait_until(lambda: pool.status().waiting >= total, timeout=60, what=f"{total} waiting")
    return made


def kill_all(client: Any, crowds: list[Proc]) -> float:
    """Kill every crowd process; the server's time once it dropped their
    presences."""
    before = presences(client, "")
    for proc in crowds:
        proc.kill()
    wait_until(lambda: presences(client, "") < before, what="the server saw them die")
    return server_now(client)


@pytest.mark.real_redis
def test_a_crowd_of_dead_clients_is_found_together(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """20 clients with 10 waiters each, killed at once (a node lost), ahead
    of a live waiter. Before, each dead client's grace started only when
    its tickets reached the head: the live waiter was served a grace per
    dead client after the kill (8 clients: 8.4 s; 100 clients: 15.5 s).
    Now the first client found absent has the others' presences checked
    with it, their graces run together, and the live waiter is served
    within 2.5 s of the kill, about one grace and one heartbeat
    (docs/concepts.md, 'The dead are found together'; docs/performance.md
    has the figures for 100 clients and 2,000 waiters)."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    crowds = queue_crowds(pool, procs, redis_url, crowds=2, clients=10, waiters=10)
    live = procs(timed_waiter, redis_url, pool_name, client_name="live")
    live.expect("ready")
    live.send("go")
    wait_until(lambda: pool.status().waiting == 201, what="the live waiter queued")
    killed = kill_all(client, crowds)
    assert pool.release(held)
    lease, _ = live.expect("granted", timeout=60)
    assert lease.granted_at - killed < 2.5 + SLACK
    live.send("release")
    assert live.expect("released") is True
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)
    # Every dead waiter left the queue: dropped, or (the first, granted the
    # resource in its turn while its grace ran) its grant taken back.
    stats = pool.stats()
    assert stats.dropped_waiters + stats.reclaimed == 200


@pytest.mark.real_redis
def test_one_gc_leaves_no_dead_waiter_behind(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """Every waiter dead (their processes killed), the resources released:
    before, their tickets stayed until ``gc()`` had run twice, a grace
    apart (the first only started the graces). Now one call waits the
    graces out and drops them all, and says so."""
    pool = FairAllocator(client, pool_name)
    pool.extend([f"r{i}" for i in range(5)])
    held = [pool.acquire(timeout=5) for _ in range(5)]
    crowds = queue_crowds(pool, procs, redis_url, crowds=1, clients=5, waiters=5)
    kill_all(client, crowds)
    for lease in held:
        assert pool.release(lease)
    report = pool.gc()
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (5, 0, 0)
    # Dropped, or granted a released resource in their turn while their
    # graces ran and the grants taken back.
    assert report.dropped_waiters + report.reclaimed == 25
    assert 0 < report.waited <= 2 * GRACE


@pytest.mark.real_redis
@pytest.mark.alone  # a rate from the times of its commands: other tests' load would skew it
def test_waiting_costs_under_a_command_a_second(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """A process whose waiter waits sends on average at most one command a
    second: its heartbeat, every 2 s, and one BLMPOP between two
    (docs/scripts/presence_crowd.py idle: 0.5 a second; before: 26
    commands in 9 s, its reader's BLPOP, LPOP and heartbeat every second,
    and a holder's presence watch added a PING a second)."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = procs(timed_waiter, redis_url, pool_name, client_name="idle")
    waiter.expect("ready")
    waiter.send("go")
    wait_until(lambda: pool.status().waiting == 1, what="queued")
    wait_until(lambda: presences(client, "idle") == 1, what="its presence")
    # Its heartbeat's own connection made (a handshake, once): then it waits.
    wait_until(
        lambda: (
            sum(
                1
                for c in client.client_list()
                if c.get("name") == "idle"
                and int(c.get("ssub", 0) or 0) + int(c.get("sub", 0)) == 0
            )
            >= 2
        ),
        what="its heartbeat's connection",
    )
    admin = redis.Redis.from_url(redis_url)
    try:
        rate = commands_per_second(admin, "idle", 3 * HEARTBEAT_PRESENT)
    finally:
        admin.close()
    # Its heartbeat and one blocking read every HEARTBEAT_PRESENT seconds:
    # a rate measured from the first command to the last, within 5 %. A
    # server without BLMPOP (Redis 6.2) gets the two-command round, BLPOP
    # and LPOP: 1.5 a second there.
    try:
        client.execute_command("BLMPOP", "0.01", 1, f"{pool_name}:probe", "LEFT")
        per_beat = 2
    except redis.exceptions.ResponseError:  # unknown command: Redis 6.2
        per_beat = 3
    assert 0 < rate <= 1.05 * per_beat / HEARTBEAT_PRESENT
    assert pool.release(held)
    waiter.expect("granted", timeout=15)
    waiter.send("release")
    assert waiter.expect("released") is True


@pytest.mark.real_redis
def test_an_asyncio_client_gets_its_presence_after_a_first_subscription_timed_out(
    redis_url: str, client: Any, pool_name: str
) -> None:
    """The server does not answer during the client's first wait (``CLIENT
    PAUSE``), so the subscription of its presence runs out of time: the
    client waits without one this time, as a sync client does, and sets it
    up at its next wait (before: never again in that pool, with a warning
    that blamed the ACL)."""
    loop = LoopThread()
    aclient = redis.asyncio.Redis.from_url(redis_url)
    try:
        apool = AsyncFairAllocator(aclient, pool_name)
        pool = FairAllocator(client, pool_name)
        pool.extend(["r"])
        client.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        first = loop.run(apool.acquire(timeout=10))
        assert first.resource == "r"
        assert pool.leases()[0].holder_present is None  # no presence this time
        loop.run(apool.release(first))
        held = pool.acquire(timeout=5)
        task = asyncio.run_coroutine_threadsafe(apool.acquire(timeout=10), loop.loop)
        wait_until(lambda: pool.status().waiting == 1, what="queued again")
        assert pool.release(held)
        second = task.result(10)
        assert pool.leases()[0].holder_present is True
        loop.run(apool.release(second))
    finally:
        loop.run(aclient.aclose())
        loop.close()


def test_a_waiter_queues_under_the_id_decided_while_it_looked(
    client: Any, pool_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another waiter's join may decide the client's presence in a pool
    between this waiter's first look at its id and its check of the
    decision: it queues under the id decided (`p.`), not the plain one,
    which the reader then neither reads nor keeps alive (its grant was
    taken back after the pick-up window, a stall of several seconds when
    50 threads of a fresh client made their first acquire at once)."""
    from allocator._sync_reader import Reader

    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    reader = pool._reader()
    looked = Reader.known_cid
    raced: list[str] = []

    def racing(self: Reader, p: Any) -> str:
        cid = looked(self, p)
        if not raced:
            raced.append(cid)
            self.join(p, 5.0)  # another waiter's join ends just now
        return cid

    monkeypatch.setattr(Reader, "known_cid", racing)
    flow = pool._waiting(
        reader,
        lambda cid, t0: pool._pool.acquire(5, None, None, True, cid=cid, started=t0),
        5,
    )
    assert raced and not raced[0].startswith("p.")  # undecided at the first look
    step = flow.steps.send(None)
    assert step.args[1].startswith("p.") and step.args[1] == reader.known_cid(pool._pool)
