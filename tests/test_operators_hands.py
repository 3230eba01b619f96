"""What an operator sees and does about one lease or one process
(docs/operations.md, "A holder shows GONE" and "A holder is stuck"): revoke
a lease by its resource and token, the holder told at once through its
presence connection (``lost()``), the clients of a pool, and a client that
is connected but stalled."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
import redis
from _workers import Proc, holder_and_waiter, lost_watcher
from helpers import wait_until

from allocator import FairAllocator, LeaseLost, SeveralLeases
from allocator.metrics import AllocatorCollector


def stalled_gauge(pool: Any) -> float:
    """The ``allocator_stalled_clients`` gauge of ``pool`` in one scrape."""
    for family in AllocatorCollector([pool]).collect():
        if family.name == "allocator_stalled_clients":
            (sample,) = family.samples
            return float(sample.value)
    raise AssertionError("no allocator_stalled_clients")


@pytest.fixture
def admin(redis_url: str, pool_name: str) -> Any:
    client = redis.Redis.from_url(redis_url)
    pool = FairAllocator(client, pool_name)
    yield pool
    pool.delete(force=True)
    client.close()


def test_revoke_names_a_lease_by_its_resource_and_token(admin: Any) -> None:
    admin.extend(["a"], capacity=2, priority=1)
    admin.extend(["b"])
    first = admin.acquire(timeout=5)
    second = admin.acquire(timeout=5)
    other = admin.acquire(timeout=5)
    assert (first.resource, second.resource, other.resource) == ("a", "a", "b")
    shown = {(info.resource, info.token) for info in admin.leases()}
    assert (first.resource, first.token) in shown
    # Several leases on the resource and no token: refused, nothing revoked.
    with pytest.raises(SeveralLeases) as several:
        admin.revoke("a")
    assert isinstance(several.value, ValueError)
    assert several.value.tokens == (first.token, second.token)
    assert str(first.token) in str(several.value)
    assert len(admin.leases()) == 3
    # The token picks; a token that no longer holds revokes nothing.
    assert admin.revoke("a", token=first.token) is True
    assert admin.revoke("a", token=first.token) is False
    with pytest.raises(LeaseLost):
        admin.renew(first)
    assert admin.renew(second).resource == "a"
    # One lease on the resource: that one, without a token.
    assert admin.revoke("a") is True
    assert admin.revoke("nothing-here") is False
    # The holder's own code names its lease by id.
    assert admin.revoke(lease_id=other.id) is True
    assert admin.leases() == ()
    assert admin.stats().revoked == 3
    with pytest.raises(TypeError, match="token"):
        admin.revoke("a", token="1")
    with pytest.raises(ValueError, match="token"):
        admin.revoke("a", token=0)
    with pytest.raises(TypeError, match="not both"):
        admin.revoke("a", lease_id=other.id)


@pytest.mark.parametrize("use_asyncio", [False, True], ids=["sync", "asyncio"])
def test_a_revoke_reaches_the_holder_at_once(
    admin: Any, redis_url: str, pool_name: str, use_asyncio: bool
) -> None:
    """The holder's lost() turns true when the revoke lands, not at its
    next renew (ttl/3 = 20 s away): its presence connection was told. The
    exit of its lease() block raises LeaseLost, and its keepalive stops."""
    admin.extend(["r"])
    holder = Proc(lost_watcher, redis_url, pool_name, use_asyncio=use_asyncio)
    try:
        lease = holder.expect("granted", timeout=30)
        # Its presence watch is listening once the lease is held.
        wait_until(lambda: admin.leases()[0].holder_present is True, what="holder connected")
        assert admin.revoke("r", token=lease.token) is True
        returned = time.time()
        lost_at = holder.expect("lost", timeout=10)
        print(f"lost() turned true {1000 * (lost_at - returned):+.1f} ms after revoke returned")
        assert lost_at - returned < 5.0  # generous: within 100 ms on an idle host
        assert holder.expect("exit", timeout=30) == "LeaseLost"
        assert admin.acquire(timeout=5).resource == "r"  # free again, nobody renewed it
    finally:
        holder.close()


def test_clients_show_each_process_and_a_stalled_one(
    admin: Any, redis_url: str, pool_name: str
) -> None:
    """One row per client process: where it runs, its waiters and leases;
    a stopped one that waits shows as stalled (connected, but silent past
    its heartbeat); once killed, as gone."""
    admin.extend(["r"])
    proc = Proc(holder_and_waiter, redis_url, pool_name)
    try:
        lease = proc.expect("holding", timeout=30)
        wait_until(lambda: admin.status().waiting == 1, what="its second acquire queued")
        (row,) = [c for c in admin.clients() if c.pid == proc.pid]
        assert (row.host, row.leases, row.waiters) == (socket.gethostname(), 1, 1)
        assert row.present is True and not row.stalled and row.version
        assert [info.client for info in admin.leases()] == [row.id]
        proc.pause()
        wait_until(
            lambda: any(c.stalled for c in admin.clients()), timeout=15, what="shown stalled"
        )
        (row,) = admin.clients()
        assert row.present is True and row.silent_for is not None and row.silent_for > 1
        assert stalled_gauge(admin) == 1
        proc.kill()
        wait_until(lambda: admin.leases()[0].holder_present is False, timeout=15, what="shown gone")
        assert not any(c.stalled for c in admin.clients())
        assert stalled_gauge(admin) == 0
        assert admin.revoke(lease.resource) is True
    finally:
        proc.close()
