"""The guarantees (docs/concepts.md#guarantees), scenario by scenario, in every flavour
(see conftest.FLAVOURS)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from _workers import server_now
from helpers import Background, ticket_key, wait_until

from allocator import AcquireTimeout, AllocatorError, Lease, LeaseLost, UnknownResource


def test_acquire_release_roundtrip(pool: Any) -> None:
    assert pool.extend(["r1", "r2"]) == 2
    assert pool.extend(["r1", "r2"]) == 0  # idempotent
    a = pool.acquire(timeout=5)
    b = pool.acquire(timeout=5)
    assert isinstance(a, Lease) and isinstance(b, Lease)
    assert {a.resource, b.resource} == {"r1", "r2"}
    assert a.pool == pool.name and a.id and a.id != b.id
    assert a.expires_at > a.granted_at
    assert a.ttl == 60.0
    status = pool.status()
    assert (status.size, status.free, status.leased, status.waiting) == (2, 0, 2, 0)
    assert pool.release(a) is True
    assert pool.release(a) is False  # double release
    assert pool.release(b) is True
    status = pool.status()
    assert (status.free, status.leased) == (2, 0)


def test_tokens_only_grow_per_resource(pool: Any) -> None:
    pool.extend(["only"])
    tokens = []
    for _ in range(5):
        lease = pool.acquire(timeout=5)
        tokens.append(lease.token)
        pool.release(lease)
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_tokens_of_grants_made_together_on_one_resource_grow(pool: Any) -> None:
    """One run that grants a resource of capacity > 1 several times (here
    extend, raising its capacity with two waiters queued) gives each grant
    its own token, in order, though the server clock reads the same
    microsecond for all of them."""
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiters = []
    for i in range(2):
        waiters.append(Background(lambda: pool.acquire(timeout=20)))
        wait_until(lambda i=i: pool.status().waiting == i + 1, what=f"waiter {i} queued")
    pool.extend(["r"], capacity=3)
    first, second = (w.join() for w in waiters)
    assert held.token < first.token < second.token
    for lease in (held, first, second):
        pool.release(lease)


def test_fencing_survives_remove_and_readd(pool: Any) -> None:
    pool.extend(["r"])
    first = pool.acquire(timeout=5)
    pool.release(first)
    assert pool.remove(["r"]) == 1
    assert pool.status().size == 0
    pool.extend(["r"])
    second = pool.acquire(timeout=5)
    assert second.token > first.token


def test_nonblocking(pool: Any) -> None:
    assert pool.acquire(blocking=False) is None  # empty pool
    pool.extend(["r"])
    held = pool.acquire(blocking=False)
    assert held is not None
    assert pool.acquire(blocking=False) is None
    pool.release(held)
    assert pool.acquire(blocking=False) is not None


def test_nonblocking_never_passes_a_waiter(pool: Any) -> None:
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Background(lambda: pool.acquire(timeout=20))
    wait_until(lambda: pool.status().waiting == 1, what="waiter queued")
    assert pool.acquire(blocking=False) is None
    pool.release(held)
    got = waiter.join()
    assert got.resource == "r"
    assert pool.acquire(blocking=False) is None
    pool.release(got)


def test_timeout_leaves_the_queue(pool: Any) -> None:
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    with pytest.raises(AcquireTimeout) as info:
        pool.acquire(timeout=0.2)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, AllocatorError)
    assert info.value.waited >= 0.2
    assert pool.status().waiting == 0
    with pytest.raises(AcquireTimeout):
        pool.acquire(timeout=0)
    assert pool.status().waiting == 0
    assert pool.release(held)
    assert pool.status().free == 1


def test_fifo_among_threads(pool: Any) -> None:
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    order: list[int] = []
    lock = threading.Lock()
    waiters = []

    def wait_and_record(i: int) -> Lease:
        lease = pool.acquire(timeout=30)
        with lock:
            order.append(i)
        pool.release(lease)
        return lease

    for i in range(5):
        waiters.append(Background(lambda i=i: wait_and_record(i)))
        wait_until(lambda i=i: pool.status().waiting == i + 1, what=f"waiter {i} queued")
    pool.release(held)
    leases = [w.join() for w in waiters]
    assert order == [0, 1, 2, 3, 4]
    tickets = [ticket_key(lease.ticket) for lease in leases]
    assert tickets == sorted(tickets)


def test_empty_pool_waits_for_extend(pool: Any) -> None:
    waiter = Background(lambda: pool.acquire(timeout=20))
    wait_until(lambda: pool.status().waiting == 1, what="waiter queued")
    pool.extend(["late"])
    assert waiter.join().resource == "late"


def test_extend_serves_several_waiters_at_once(pool: Any) -> None:
    waiters = []
    for i in range(3):
        waiters.append(Background(lambda: pool.acquire(timeout=20)))
        wait_until(lambda i=i: pool.status().waiting == i + 1)
    pool.extend(["a", "b", "c"])
    assert sorted(w.join().resource for w in waiters) == ["a", "b", "c"]


def test_concurrent_double_release_hands_off_once(pool: Any) -> None:
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    waiter = Background(lambda: pool.acquire(timeout=20))
    wait_until(lambda: pool.status().waiting == 1)
    barrier = threading.Barrier(2)

    def release() -> bool:
        barrier.wait()
        return bool(pool.release(held))

    results = [Background(release), Background(release)]
    assert sorted(r.join() for r in results) == [False, True]
    got = waiter.join()
    status = pool.status()
    assert (status.leased, status.waiting) == (1, 0)
    assert pool.release(got)


def test_renew_extends_and_stale_holder_cannot_touch_successor(pool: Any) -> None:
    pool.extend(["r"])
    lease = pool.acquire(timeout=5, ttl=5)  # long enough to be renewed on a loaded machine
    renewed = pool.renew(lease, ttl=30)
    assert renewed.expires_at > lease.expires_at and renewed.ttl == 30
    assert renewed.token == lease.token and renewed.id == lease.id
    pool.release(renewed)

    short = pool.acquire(timeout=5, ttl=0.05)
    # The next requester reclaims the expired lease by itself (no gc).
    successor = pool.acquire(timeout=10)
    assert successor.token > short.token
    with pytest.raises(LeaseLost):
        pool.renew(short)
    assert pool.release(short) is False
    # The successor's lease is untouched.
    assert pool.renew(successor).expires_at >= successor.expires_at
    assert pool.release(successor) is True


def test_renew_never_revives_an_expired_lease(pool: Any, raw: Any) -> None:
    pool.extend(["r"])
    lease = pool.acquire(timeout=5, ttl=0.05)
    wait_until(lambda: server_now(raw) > lease.expires_at + 0.005, what="lease deadline")
    with pytest.raises(LeaseLost):
        pool.renew(lease, ttl=60)
    assert pool.status().leased == 0


def test_gc_reclaims_expired_leases(pool: Any, raw: Any) -> None:
    pool.extend(["a", "b"])
    # Both leases must be held at once: a ttl the second acquire cannot
    # outlast, even on a loaded machine (0.05 s could, and 0.5 s could on
    # fakeredis beside the suite's other workers: the second acquire then
    # took the first lease's resource back itself).
    leases = [pool.acquire(timeout=5, ttl=2.0) for _ in range(2)]
    last = max(lease.expires_at for lease in leases)
    wait_until(lambda: server_now(raw) > last + 0.005, what="both deadlines")
    report = pool.gc()
    assert report.reclaimed == 2
    assert pool.gc().reclaimed == 0
    status = pool.status()
    assert (status.leased, status.free) == (0, 2)


def test_lease_context_manager(pool: Any) -> None:
    pool.extend(["r"])
    with pool.lease(timeout=5) as held:
        assert held.resource == "r"
        assert pool.status().leased == 1
    assert pool.status().leased == 0

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with pool.lease(timeout=5):
            raise Boom()
    assert pool.status().leased == 0


def test_lease_exit_raises_when_lost(pool: Any) -> None:
    pool.extend(["r"])
    with pytest.raises(LeaseLost):
        with pool.lease(timeout=5) as held:
            pool.remove([held.resource], force=True)
    pool.extend(["r"])
    assert pool.status().free == 1


def test_keepalive_keeps_a_short_lease(pool: Any, raw: Any) -> None:
    pool.extend(["r"])
    # A renewal every ttl/3: a ttl of 1 s leaves the renewing thread 0.67 s
    # of slack, which a loaded machine does not eat up (0.3 s left 0.2 s,
    # and a busy run of the suite's workers side by side did).
    with pool.lease(timeout=5, ttl=1.0, keepalive=True) as held:
        start = pool.status().server_time
        # Hold across several ttls (server clock), renewed in the background.
        wait_until(lambda: pool.status().server_time > start + 3.0, what="3s of server time")
        assert pool.acquire(blocking=False) is None
        assert pool.status().leased == 1
    assert held.resource == "r"
    assert pool.status().free == 1


def test_capacity(pool: Any) -> None:
    pool.extend(["gpu"], capacity=3)
    leases = [pool.acquire(timeout=5) for _ in range(3)]
    assert {lease.resource for lease in leases} == {"gpu"}
    assert len({lease.token for lease in leases}) == 3
    assert pool.acquire(blocking=False) is None
    row = pool.status().resources[0]
    assert (row.leases, row.state, row.capacity) == (3, "leased", 3)
    pool.release(leases[0])
    assert pool.status().resources[0].state == "free"
    assert pool.acquire(blocking=False) is not None


def test_capacity_change_keeps_leases(pool: Any) -> None:
    pool.extend(["r"], capacity=2)
    a = pool.acquire(timeout=5)
    b = pool.acquire(timeout=5)
    pool.extend(["r"], capacity=1)  # now over capacity: no grants until one leaves
    assert pool.acquire(blocking=False) is None
    pool.release(a)
    assert pool.acquire(blocking=False) is None
    pool.release(b)
    assert pool.acquire(blocking=False) is not None


def test_remove_drains_a_leased_resource(pool: Any) -> None:
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)
    other = "b" if held.resource == "a" else "a"
    assert pool.remove([held.resource, "nope"]) == 1
    rows = {row.name: row for row in pool.status().resources}
    assert rows[held.resource].state == "draining"
    assert pool.status().size == 2
    # No new grants of the draining one.
    got = pool.acquire(timeout=5)
    assert got.resource == other
    assert pool.acquire(blocking=False) is None
    assert pool.renew(held).token == held.token  # still a live lease
    assert pool.release(held) is True
    assert pool.status().size == 1


def test_force_remove_revokes(pool: Any) -> None:
    pool.extend(["r"])
    held = pool.acquire(timeout=5)
    assert pool.remove(["r"], force=True) == 1
    assert pool.status().size == 0
    with pytest.raises(LeaseLost):
        pool.renew(held)
    assert pool.release(held) is False
    # Re-added, the old lease stays void, and tokens continue.
    pool.extend(["r"])
    assert pool.release(held) is False
    again = pool.acquire(timeout=5)
    assert again.token > held.token
    assert pool.status().resources[0].leases == 1


def test_priority_then_least_recently_used(pool: Any) -> None:
    pool.extend(["low"], priority=0)
    pool.extend(["high1", "high2"], priority=10)
    first = pool.acquire(timeout=5)
    second = pool.acquire(timeout=5)
    assert {first.resource, second.resource} == {"high1", "high2"}
    third = pool.acquire(timeout=5)
    assert third.resource == "low"
    # Release in order high2, then high1: high2 has been free for longest.
    by_name = {lease.resource: lease for lease in (first, second)}
    pool.release(by_name["high2"])
    pool.release(by_name["high1"])
    assert pool.acquire(timeout=5).resource == "high2"
    assert pool.acquire(timeout=5).resource == "high1"


def test_priority_update_moves_resource(pool: Any) -> None:
    pool.extend(["a", "b"])
    pool.extend(["b"], priority=5)
    assert pool.acquire(timeout=5).resource == "b"


def test_soft_binding(pool: Any) -> None:
    pool.extend(["a", "b", "c"])
    first = pool.acquire(timeout=5, bind="w1")
    pool.release(first)
    # Free bound resource: same one again, before any other.
    for _ in range(3):
        again = pool.acquire(timeout=5, bind="w1")
        assert again.resource == first.resource
        pool.release(again)
    # Bound one busy: another one now, binding kept for next time.
    blocker = pool.acquire(timeout=5, bind="w1")
    other = pool.acquire(timeout=5, bind="w1")
    assert other.resource != first.resource
    pool.release(other)
    pool.release(blocker)
    assert pool.acquire(timeout=5, bind="w1").resource == first.resource
    status = pool.status()
    assert status.bindings == 1
    assert status.bind_hits == 5 and status.bind_misses == 2


def test_binding_moves_when_resource_leaves(pool: Any) -> None:
    pool.extend(["a", "b"])
    pool.bind("w", "a")
    pool.remove(["a"])
    got = pool.acquire(timeout=5, bind="w")
    assert got.resource == "b"
    pool.release(got)
    pool.extend(["a"])
    assert pool.acquire(timeout=5, bind="w").resource == "b"


def test_bind_unbind(pool: Any) -> None:
    pool.extend(["a", "b"])
    with pytest.raises(UnknownResource) as info:
        pool.bind("w", "zzz")
    assert isinstance(info.value, KeyError)
    pool.bind("w", "b")
    assert pool.acquire(timeout=5, bind="w").resource == "b"
    assert pool.unbind("w") is True
    assert pool.unbind("w") is False


def test_binding_expires(factory: Any, pool_name: str, raw: Any) -> None:
    pool = factory.pool(pool_name, bind_ttl=0.05)
    pool.extend(["a", "b"])
    pool.bind("w", "b")
    start = pool.status().server_time
    wait_until(lambda: pool.status().server_time > start + 0.1)
    assert pool.status().bindings == 0
    assert pool.gc().expired_bindings == 1
    assert pool.unbind("w") is False


def test_quarantine(pool: Any) -> None:
    pool.extend(["bad", "good"], priority=0)
    pool.extend(["bad"], priority=1)
    lease = pool.acquire(timeout=5)
    assert lease.resource == "bad"
    pool.release(lease, quarantine=0.4)
    row = {r.name: r for r in pool.status().resources}["bad"]
    assert row.state == "quarantined" and row.until is not None
    assert pool.acquire(timeout=5).resource == "good"
    # Only the quarantined one is left: a waiter is woken when it ends.
    back = pool.acquire(timeout=20)
    assert back.resource == "bad"
    assert back.granted_at >= row.until


def test_rate_limit_window(pool: Any) -> None:
    pool.extend(["api"], capacity=10, rate=(3, 0.5))
    grants = []
    for _ in range(7):
        lease = pool.acquire(timeout=20)
        grants.append(lease.granted_at)
        pool.release(lease)
    for i in range(len(grants)):
        in_window = [g for g in grants if grants[i] <= g < grants[i] + 0.5]
        assert len(in_window) <= 3, grants
    row = pool.status().resources[0]
    assert row.rate == (3, 0.5)


def test_rate_limit_removed_by_extend(pool: Any) -> None:
    pool.extend(["api"], rate=(1, 60))
    pool.release(pool.acquire(timeout=5))
    assert pool.status().resources[0].throttled
    assert pool.acquire(blocking=False) is None
    pool.extend(["api"], rate=None)
    assert pool.acquire(blocking=False) is not None


def test_names_with_braces_and_unicode(factory: Any, pool_name: str) -> None:
    # "a{b}c" and "a%7Bb%7Dc" must not collide once braces are escaped.
    names = [n + pool_name for n in ("a{b}c", "}{", "{x}", "прокси-пул ✓ ", "a%7Bb%7Dc")]
    pools = [factory.pool(n) for n in names]
    for p, n in zip(pools, names, strict=False):
        p.extend([f"res-{n}"])
    for p, n in zip(pools, names, strict=False):
        status = p.status()
        assert [r.name for r in status.resources] == [f"res-{n}"]
        lease = p.acquire(timeout=5)
        assert lease.resource == f"res-{n}"


def test_resource_names_with_pipes_and_unicode(pool: Any) -> None:
    odd = ["a|b|c", "ключ|1", "http://user:pw@host:3128/x?y=1|2", "x" * 1024]
    pool.extend(odd)
    got = sorted(pool.acquire(timeout=5).resource for _ in odd)
    assert got == sorted(odd)
    assert sorted(r.name for r in pool.status().resources) == sorted(odd)
