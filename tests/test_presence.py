"""Presence: a dead process is told from a stalled one (docs/concepts.md,
'Liveness marks, presence and dead waiters').

Each client keeps one connection subscribed to a channel named by its id
under each pool it waits in; the scripts count the channel's subscribers.
The kernel closes a dead process's sockets and the server drops them at
once, so a dead waiter is gone a grace (1 s) after a script first finds it
absent; a stopped one keeps its connections, and its grant and place, until
its liveness mark runs out (12 s after its last heartbeat).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from _proxy import PartitionProxy
from _workers import Proc, async_leaser, leaser, partitioned_holder, server_now
from helpers import Background, wait_until

from allocator import FairAllocator, Lease, LeaseLost
from allocator._core.presence import ALIVE_PRESENT

#: What the clock bounds below allow beyond the 2 s in which those behind a
#: dead waiter are served (docs/concepts.md#4-liveness): a loaded 2-core
#: machine's scheduling. The mark alone would take 12 s.
SLACK = 1.0


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    made = redis.Redis.from_url(redis_url, decode_responses=True)
    yield made
    made.close()


def subscribed(client: Any) -> int:
    """Connections subscribed to some channel right now (presences)."""
    return sum(
        1 for c in client.client_list() if int(c.get("ssub", 0) or 0) + int(c.get("sub", 0)) > 0
    )


def queue_one(pool: FairAllocator, procs: Callable[..., Proc], url: str, waiting: int) -> Proc:
    worker = procs(leaser, url, pool.name, wait_go=True)
    worker.expect("ready")
    worker.send("go")
    wait_until(lambda: pool.status().waiting == waiting, what=f"{waiting} waiting")
    return worker


@pytest.mark.real_redis
def test_a_waiter_killed_at_the_head_holds_nobody_up(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """The next waiter is served within 2 s of the kill or of the release,
    whichever is later (0.2: about 5 s; the mark alone now: 12 s)."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    before = subscribed(client)
    dead = queue_one(pool, procs, redis_url, 1)
    wait_until(lambda: subscribed(client) == before + 1, what="its presence")
    after = queue_one(pool, procs, redis_url, 2)
    dead.kill()
    wait_until(lambda: subscribed(client) == before + 1, what="the server saw it die")
    killed = server_now(client)
    assert pool.release(held)
    released = server_now(client)
    lease: Lease = after.expect("granted", timeout=ALIVE_PRESENT)
    assert lease.granted_at - max(killed, released) < 2.0 + SLACK
    after.send("release")
    assert after.expect("released") is True
    pool.gc()
    status = pool.status()
    assert (status.free, status.leased, status.waiting) == (1, 0, 0)


@pytest.mark.real_redis
def test_a_waiter_stopped_for_ten_seconds_keeps_its_grant_and_its_place(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """SIGSTOP for 10 s (its connections stay open): the grant pushed to it
    meanwhile stays its own, and the waiter behind it is not served first.
    This test waits 10 s of real time: that is what it checks."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    early = queue_one(pool, procs, redis_url, 1)
    late = queue_one(pool, procs, redis_url, 2)
    early.pause()
    try:
        stopped = server_now(client)
        assert pool.release(held)  # granted to the stopped waiter
        wait_until(lambda: server_now(client) > stopped + 10.0, timeout=20, what="10 s")
        assert late.poll() is None  # not served past it
        status = pool.status()
        assert (status.leased, status.waiting) == (1, 1)
    finally:
        early.resume()
    first: Lease = early.expect("granted", timeout=10)
    assert first.token > held.token
    early.send("release")
    assert early.expect("released") is True
    second: Lease = late.expect("granted", timeout=10)
    assert second.token > first.token
    late.send("release")
    assert late.expect("released") is True
    assert pool.stats().reclaimed == 0


@pytest.mark.real_redis
def test_status_and_leases_show_a_killed_holder_gone(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    pool = FairAllocator(client, pool_name)
    pool.extend(["a", "b"])
    holder = procs(leaser, redis_url, pool_name)
    holder.expect("ready")
    holder.expect("granted")
    mine = pool.acquire(timeout=5)
    infos = {info.token: info for info in pool.leases()}
    assert infos[mine.token].holder_present is True
    assert {info.holder_present for info in infos.values()} == {True}
    assert pool.status().absent_holders == 0
    holder.kill()
    wait_until(lambda: pool.status().absent_holders == 1, timeout=5, what="the holder shown gone")
    status = pool.status()
    gone = next(row for row in status.resources if row.absent_holders)
    assert gone.name != mine.resource and gone.leases == 1
    infos = {info.token: info for info in pool.leases()}
    assert infos[mine.token].holder_present is True
    assert [i.holder_present for i in infos.values() if i.token != mine.token] == [False]
    # Its lease stays until its deadline (reclaiming on absence is not on by
    # default): the resource is not granted meanwhile.
    assert pool.acquire(blocking=False) is None


def test_revoke_ends_one_lease_and_the_resource_keeps_its_settings(pool: Any) -> None:
    pool.extend(["r"], capacity=1, priority=5, rate=(100, 60))
    held = pool.acquire(timeout=5)
    waiter = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="the waiter queued")
    assert pool.revoke(lease_id=held.id) is True
    got = waiter.join()
    assert got.resource == "r" and got.token > held.token
    with pytest.raises(LeaseLost):
        pool.renew(held)
    assert pool.release(held) is False
    assert pool.revoke(lease_id=held.id) is False  # ended already
    row = pool.status().resources[0]
    assert (row.capacity, row.priority, row.rate) == (1, 5.0, (100, 60.0))
    assert pool.stats().revoked == 1
    with pytest.raises(TypeError, match="lease_id"):
        pool.revoke(lease_id=7)
    with pytest.raises(TypeError, match="resource"):
        pool.revoke(7)
    assert pool.release(got)


def test_a_client_without_a_presence_shows_nobody_can_tell(factory: Any, pool_name: str) -> None:
    """fakeredis keeps no presence: its holders read as None, not gone."""
    if factory.backend != "fake":
        pytest.skip("fakeredis only")
    pool = factory.pool(pool_name)
    pool.extend(["r"])
    lease = pool.acquire(timeout=5)
    assert [info.holder_present for info in pool.leases()] == [None]
    assert pool.status().absent_holders == 0
    pool.release(lease)


# -- reclaim_on_disconnect: a dead holder's lease ends at once ----------------------


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_killed_holder_is_reclaimed_at_once_with_reclaim_on_disconnect(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc], kind: str
) -> None:
    """With the option on, the next waiter is served within 2 s of the
    holder's death (off, at the lease's deadline: the test above)."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    worker = leaser if kind == "sync" else async_leaser
    extra = {"wait_go": True} if kind == "sync" else {}
    holder = procs(worker, redis_url, pool_name, reclaim=True, **extra)
    holder.expect("ready")
    holder.send("go")
    held: Lease = holder.expect("granted")
    assert held.expires_at - held.granted_at > 30  # far from its deadline
    after = queue_one(pool, procs, redis_url, 1)
    holder.kill()
    killed = server_now(client)
    got: Lease = after.expect("granted", timeout=10)
    assert got.granted_at - killed < 2.0 + SLACK
    assert got.token > held.token
    assert pool.stats().reclaimed == 1
    after.send("release")
    assert after.expect("released") is True


@pytest.mark.real_redis
def test_a_holder_stopped_for_a_while_keeps_its_lease_with_reclaim_on_disconnect(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """SIGSTOP keeps the holder's connections open: the server does not end
    its lease, and the holder, once resumed, does not give it up either
    (its presence answers again). Waits 3 s of real time."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    holder = procs(leaser, redis_url, pool_name, reclaim=True)
    holder.expect("ready")
    held: Lease = holder.expect("granted")
    waiter = queue_one(pool, procs, redis_url, 1)
    holder.pause()
    try:
        stopped = server_now(client)
        wait_until(lambda: server_now(client) > stopped + 3.0, what="3 s")
        assert waiter.poll() is None
        assert pool.status().absent_holders == 0
    finally:
        holder.resume()
    holder.send("renew")
    renewed: Lease = holder.expect("renewed")
    assert renewed.token == held.token
    holder.send("release")
    assert holder.expect("released") is True
    assert waiter.expect("granted").token > held.token
    waiter.send("release")
    assert waiter.expect("released") is True
    assert pool.stats().reclaimed == 0


@pytest.mark.real_redis
def test_a_partitioned_holder_gives_its_lease_up_before_it_is_granted_again(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """A partition (a proxy that stops forwarding, closing nothing) leaves
    the holder's socket open on the server, which cannot tell it from a
    stall: the lease ends at its deadline (5 s), since no renewal gets
    through. The holder, its presence unanswered for longer than the
    grace, gives the lease up by itself first: ``renew`` raises LeaseLost
    without reaching the server, and ``release`` returns False."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    with PartitionProxy(redis_url) as proxy:
        holder = procs(partitioned_holder, proxy.url, pool_name)
        held: Lease = holder.expect("granted")
        waiter = queue_one(pool, procs, redis_url, 1)
        wait_until(lambda: [i.holder_present for i in pool.leases()] == [True], what="present")
        proxy.partition()
        gave_up: float = holder.expect("gave_up", timeout=15)
        got: Lease = waiter.expect("granted", timeout=15)
        assert gave_up < got.granted_at
        assert got.token > held.token
        holder.send("release")
        assert holder.expect("released", timeout=15) is False
    waiter.send("release")
    assert waiter.expect("released") is True


@pytest.mark.real_redis
def test_a_holder_that_never_waits_subscribes_again_when_its_presence_is_dropped(
    redis_url: str, client: Any, pool_name: str, procs: Callable[..., Proc]
) -> None:
    """A holder has no reader rounds, whose heartbeat would notice: its
    presence watch does (a restart or a failover drops every presence)."""
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    holder = procs(leaser, redis_url, pool_name)
    holder.expect("ready")
    holder.expect("granted")
    wait_until(lambda: [i.holder_present for i in pool.leases()] == [True], what="present")
    client.client_kill_filter(_type="pubsub")
    wait_until(lambda: [i.holder_present for i in pool.leases()] == [True], what="back")
    holder.send("release")
    assert holder.expect("released") is True
