"""Fair shares between tenants (docs/concepts.md#tenants): the pool's order
``tenant`` beside today's ``fifo``, against a real server, with several
OS processes where requests of different clients compete.

Grant order is read from fencing tokens: on one resource every grant has a
token strictly greater than the one before, so sorting grants by token is
sorting them by the time they were made. Requests are queued one after the
other where their order matters (the test waits for the queue to grow), and
released by the test where it steers what comes next: no test waits for
time to pass.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from _tenant_workers import tenant_client
from _workers import Proc
from helpers import Background, ticket_key, wait_until

from allocator import AsyncFairAllocator, FairAllocator, Lease, TenantStatus
from allocator._core.keys import KEY_SUFFIXES

# -- helpers ---------------------------------------------------------------------


class Clients:
    """Worker processes (one client of the pool each) and what they report."""

    def __init__(self, start: Callable[..., Proc], url: str, name: str) -> None:
        self.start, self.url, self.name = start, url, name
        self.procs: list[Proc] = []
        #: Reports read while looking for another kind, in order.
        self.held: list[tuple[str, Any]] = []

    def new(self) -> Proc:
        """A worker whose client has made one request already (a resource
        must be free): its reader and presence are set up before the test
        starts many requests at once."""
        proc = self.start(tenant_client, self.url, self.name)
        self.procs.append(proc)
        proc.send(("warm",))
        proc.expect("warm", timeout=60)
        return proc

    def next(self, kind: str = "granted", timeout: float = 60.0) -> Any:
        """The next report of ``kind`` from any worker (an error fails; a
        report of another kind is kept for its own turn)."""
        for i, (got, payload) in enumerate(self.held):
            if got == kind:
                del self.held[i]
                return payload
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                message = proc.poll()
                if message is None:
                    continue
                got, payload = message
                assert got != "error", payload
                if got == kind:
                    return payload
                self.held.append(message)
            time.sleep(0.002)
        raise AssertionError(f"no {kind!r} report within {timeout} s")

    def grants(self, n: int, timeout: float = 120.0) -> list[dict[str, Any]]:
        """The next ``n`` grants reported, in the order they were made."""
        got = [self.next("granted", timeout) for _ in range(n)]
        return sorted(got, key=lambda g: g["token"])

    def stop(self) -> None:
        for proc in self.procs:
            proc.send(("stop",))
        for proc in self.procs:
            proc.until("stopped", timeout=120)


@pytest.fixture
def clients(
    procs: Callable[..., Proc], redis_url: str, pool_name: str
) -> Iterator[Callable[[], Clients]]:
    yield lambda: Clients(procs, redis_url, pool_name)


@pytest.fixture
def admin(redis_url: str, pool_name: str) -> Iterator[FairAllocator]:
    client = redis.Redis.from_url(redis_url)
    pool = FairAllocator(client, pool_name)
    yield pool
    pool.close()
    client.close()


def queued(pool: Any, n: int, what: str = "") -> None:
    wait_until(lambda: pool.status().waiting == n, what=what or f"{n} waiting")


def in_ticket_order(grants: list[dict[str, Any]]) -> bool:
    tickets = [ticket_key(g["ticket"]) for g in grants]
    return tickets == sorted(tickets)


def per_tenant_fifo(grants: list[dict[str, Any]]) -> None:
    """Within each tenant, grants follow the order its requests came in."""
    for tenant in {g["tenant"] for g in grants}:
        mine = [g for g in grants if g["tenant"] == tenant]
        assert in_ticket_order(mine), f"tenant {tenant!r} served out of its own order"


# -- a burst and a lone request ------------------------------------------------------


@pytest.mark.parametrize("order", ["tenant", "fifo"])
def test_a_lone_request_is_not_stuck_behind_a_burst(
    admin: FairAllocator, clients: Callable[[], Clients], order: str
) -> None:
    """Tenant ``burst`` queues 50 requests, then tenant ``lone`` one: under
    ``tenant`` the lone request is among the first two grants after it
    queued; under ``fifo`` it comes after the whole burst."""
    admin.extend(["only"])
    admin.set_order(order)
    workers = clients()
    bursts, lone = [workers.new(), workers.new()], workers.new()
    held = admin.acquire(timeout=5)
    for i in range(50):
        bursts[i % 2].send(("queue", f"b{i}", "burst", False))
    queued(admin, 50)
    lone.send(("queue", "lone", "lone", False))
    queued(admin, 51)
    admin.release(held)
    grants = workers.grants(51)
    where = [g["tag"] for g in grants].index("lone")
    if order == "tenant":
        assert where <= 1, f"the lone request was grant {where + 1}"
    else:
        # Every request of the burst queued before it. (A waiter whose
        # grant was taken back, its client silent past the pick-up window
        # on a loaded machine, queues again behind it, with a new ticket.)
        lone = grants[where]
        before = [g for g in grants if ticket_key(g["ticket"]) < ticket_key(lone["ticket"])]
        assert where == len(before) and in_ticket_order(grants)
        assert where >= 50 - admin.stats().reclaimed, [g["tag"] for g in grants]
    per_tenant_fifo(grants)
    seen = {t.name: t for t in admin.status().tenants}
    # (A grant taken back is counted, and granted again.)
    reclaimed = admin.stats().reclaimed
    assert seen["lone"].grants == 1 and 50 <= seen["burst"].grants <= 50 + reclaimed
    workers.stop()


def test_weights_share_the_resource_three_to_one(
    admin: FairAllocator, clients: Callable[[], Clients]
) -> None:
    """Two tenants that always have requests waiting, weights 3 and 1: of
    the grants while both wait, three in four go to the first, within 10 %."""
    admin.extend(["only"])
    admin.set_order("tenant")
    admin.set_tenant_weight("heavy", 3)
    workers = clients()
    heavy, light = workers.new(), workers.new()
    held = admin.acquire(timeout=5)
    heavy.send(("sustain", "heavy", 8))
    light.send(("sustain", "light", 4))
    queued(admin, 12)
    admin.release(held)
    # Every thread queues again as soon as it released, and each tenant has
    # more threads than grants in a row (3 and 1), so both wait all along
    # the first 400 grants, however slowly a thread queues again on a
    # loaded machine (with 3 threads each, a heavy thread late to queue
    # again left its tenant's line empty, and the grant went to the light).
    grants = workers.grants(400)
    workers.stop()
    share = Counter(g["tenant"] for g in grants)
    assert abs(share["heavy"] / 400 - 0.75) <= 0.075, share
    per_tenant_fifo(grants)
    weights = {t.name: t.weight for t in admin.status().tenants}
    # ("": the test's own lease, which named no tenant.)
    assert weights == {"heavy": 3.0, "light": 1.0, "": 1.0}


# -- the order with one tenant is today's order -----------------------------------


def grant_sequence(pool: Any, tenant: str | None, n: int = 12) -> list[int]:
    """Queue ``n`` requests one after the other on a held resource, then let
    them go: the order they are granted in, by their place in the queue."""
    held = pool.acquire(timeout=5)
    order: list[int] = []
    waiters = []

    def wait_and_record(i: int) -> Lease:
        lease = pool.acquire(timeout=60, tenant=tenant)
        order.append(i)
        pool.release(lease)
        return lease

    for i in range(n):
        waiters.append(Background(lambda i=i: wait_and_record(i)))
        queued(pool, i + 1)
    pool.release(held)
    leases = [w.join() for w in waiters]
    assert sorted(ticket_key(x.ticket) for x in leases) == [ticket_key(x.ticket) for x in leases]
    return order


@pytest.mark.parametrize("tenant", ["solo", "", None])
def test_one_tenant_is_served_in_todays_order(
    pool: Any, factory: Any, pool_name: str, tenant: str | None
) -> None:
    pool.extend(["only"])
    fifo = grant_sequence(pool, tenant)
    other = factory.pool(pool_name + "-t")
    other.extend(["only"])
    other.set_order("tenant")
    assert other.status().order == "tenant"
    assert grant_sequence(other, tenant) == fifo == list(range(12))


def test_two_tenants_take_turns_and_each_keeps_its_own_order(pool: Any) -> None:
    """Under ``tenant``, equal weights: A A A A B B B B queued in that order
    are served A B A B A B A B (each tenant in its own arrival order)."""
    pool.extend(["only"])
    pool.set_order("tenant")
    held = pool.acquire(timeout=5)
    order: list[str] = []
    waiters = []

    def wait_and_record(tag: str, tenant: str) -> Lease:
        lease = pool.acquire(timeout=60, tenant=tenant)
        order.append(tag)
        pool.release(lease)
        return lease

    for i, tenant in enumerate("AAAABBBB"):
        tag = f"{tenant}{i % 4}"
        waiters.append(Background(lambda tag=tag, tenant=tenant: wait_and_record(tag, tenant)))
        queued(pool, i + 1)
    pool.release(held)
    for w in waiters:
        w.join()
    assert order == ["A0", "B0", "A1", "B1", "A2", "B2", "A3", "B3"]


def test_a_tenant_back_from_idle_banks_no_credit(pool: Any) -> None:
    """A tenant served alone for a while does not make the next one that
    arrives owe it: a tenant that starts waiting is raised to the least
    count of those waiting, so the two take turns at once."""
    pool.extend(["only"])
    pool.set_order("tenant")
    for _ in range(5):  # "old" is served alone: its count grows
        pool.release(pool.acquire(timeout=5, tenant="old"))
    held = pool.acquire(timeout=5, tenant="old")
    order: list[str] = []
    waiters = []

    def wait_and_record(tag: str, tenant: str) -> None:
        lease = pool.acquire(timeout=60, tenant=tenant)
        order.append(tag)
        pool.release(lease)

    for i, (tag, tenant) in enumerate(
        [("o1", "old"), ("o2", "old"), ("n1", "new"), ("n2", "new"), ("n3", "new")]
    ):
        waiters.append(Background(lambda tag=tag, tenant=tenant: wait_and_record(tag, tenant)))
        queued(pool, i + 1)
    pool.release(held)
    for w in waiters:
        w.join()
    # "new" came in while "old" waited: raised to old's count, it ties and
    # the tie goes to the first waiter that came first (o1). Without the
    # raise, "new" would be served three times before "old" again.
    assert order == ["o1", "n1", "o2", "n2", "n3"]


# -- switching the order under load -----------------------------------------------------


def test_switching_the_order_under_load(
    admin: FairAllocator, clients: Callable[[], Clients]
) -> None:
    """Two resources; tenant B queues 12 requests, then L 4, all held until
    the test releases them. Switched to ``tenant`` after two grants, L is
    served within the next two; switched back to ``fifo`` while leases
    granted out of queue order are held, the rest is served in queue order.
    No request is granted twice or lost, and never more than two leases
    are held at once."""
    admin.extend(["r1", "r2"])
    workers = clients()
    b, lone = workers.new(), workers.new()
    held = [admin.acquire(timeout=5), admin.acquire(timeout=5)]
    tenant_of: dict[str, Proc] = {}
    for i in range(12):
        b.send(("queue", f"B{i:02d}", "B", True))
        tenant_of[f"B{i:02d}"] = b
        queued(admin, i + 1)
    for i in range(4):
        lone.send(("queue", f"L{i}", "L", True))
        tenant_of[f"L{i}"] = lone
        queued(admin, 13 + i)
    granted: list[dict[str, Any]] = []
    holding: list[str] = []

    def release(tag: str) -> dict[str, Any]:
        """Release the lease of ``tag``: the next waiter is granted it."""
        tenant_of[tag].send(("release", tag))
        got = workers.next("granted")
        workers.next("released")
        holding.remove(tag)
        return got

    def note(grant: dict[str, Any]) -> None:
        granted.append(grant)
        holding.append(grant["tag"])
        assert len(holding) <= 2

    for lease in held:
        admin.release(lease)
        note(workers.next("granted"))
    assert [g["tag"] for g in granted] == ["B00", "B01"]  # fifo

    admin.set_order("tenant")
    assert admin.status().order == "tenant"
    note(release("B00"))
    note(release("B01"))
    # Under fifo these would be B02 and B03.
    assert "L0" in {g["tag"] for g in granted[2:4]}
    while len(granted) < 8:
        note(release(holding[0]))
    # Out of queue order: L's requests went ahead of B's.
    assert not in_ticket_order(granted)
    admin.set_order("fifo")
    assert admin.status().order == "fifo"
    before = len(granted)
    while len(granted) < 16:
        note(release(holding[0]))
    after = granted[before:]
    assert in_ticket_order(after), [g["tag"] for g in after]
    for tag in list(holding):
        tenant_of[tag].send(("release", tag))
        workers.next("released")
    tags = [g["tag"] for g in granted]
    assert sorted(tags) == sorted(tenant_of) and len(set(tags)) == 16
    for resource in ("r1", "r2"):
        tokens = [g["token"] for g in granted if g["resource"] == resource]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    status = admin.status()
    assert (status.waiting, status.leased, status.free) == (0, 0, 2)
    workers.stop()


def test_a_switch_builds_the_index_in_steps(admin: FairAllocator, monkeypatch: Any) -> None:
    """Switched to ``tenant`` with requests waiting, the index is built a
    bounded step at a time (here 3 tickets a step), the queue served in
    arrival order meanwhile; then the next grants follow the tenant order."""
    from allocator._core import admin as admin_module

    monkeypatch.setattr(admin_module, "ORDER_STEP", 3)
    admin.extend(["only"])
    held = admin.acquire(timeout=5)
    order: list[str] = []
    waiters = []

    def wait_and_record(tag: str, tenant: str) -> None:
        lease = admin.acquire(timeout=60, tenant=tenant)
        order.append(tag)
        admin.release(lease)

    plan = [(f"A{i}", "A") for i in range(8)] + [("B0", "B"), ("B1", "B")]
    for i, (tag, tenant) in enumerate(plan):
        waiters.append(Background(lambda tag=tag, tenant=tenant: wait_and_record(tag, tenant)))
        queued(admin, i + 1)
    steps: list[str] = []
    call = admin._pool.set_order

    def counting(order_: object) -> Any:
        flow = call(order_)
        reply = None
        while True:
            try:
                step = flow.send(reply)
            except StopIteration as stop:
                return stop.value
            if getattr(step, "script", None) == "set_order":
                steps.append(str(step.args))
            reply = yield step

    admin._drive(counting("tenant"))
    assert admin.status().order == "tenant"
    assert len(steps) == 4  # 10 tickets, 3 a step: 3 + 3 + 3 + 1
    admin.release(held)
    for w in waiters:
        w.join()
    assert order[:4] == ["A0", "B0", "A1", "B1"]


# -- everything else keeps working in this order ------------------------------------------


def test_several_resources_at_once_are_not_starved(
    admin: FairAllocator, clients: Callable[[], Clients]
) -> None:
    """Tenant M asks for both resources at once while tenant S floods
    single requests: once M's request is the chosen next, nobody of any
    tenant is served before it, and it is granted while S still waits."""
    admin.extend(["r1", "r2"])
    admin.set_order("tenant")
    workers = clients()
    single, many = workers.new(), workers.new()
    held = [admin.acquire(timeout=5), admin.acquire(timeout=5)]
    for i in range(10):
        single.send(("queue", f"S{i}", "S", False))
        queued(admin, i + 1)
    many.send(("queue_many", "M", "M", 2, False))
    queued(admin, 11)
    for i in range(10, 20):
        single.send(("queue", f"S{i}", "S", False))
        queued(admin, i + 2)
    for lease in held:
        admin.release(lease)
    grants = workers.grants(21)
    tags = [g["tag"] for g in grants]
    assert tags.index("M") <= 2, tags
    m = next(g for g in grants if g["tag"] == "M")
    assert sorted(m["resources"]) == ["r1", "r2"]
    per_tenant_fifo(grants)
    workers.stop()


def test_soft_binding_and_priorities_hold_under_the_tenant_order(pool: Any) -> None:
    """A priority orders resources, not tenants; a binding keeps its
    resource while it is free; capacity counts leases as before."""
    pool.extend(["low"], priority=0, capacity=2)
    pool.extend(["high"], priority=5)
    pool.set_order("tenant")
    first = pool.acquire(timeout=5, tenant="a")
    assert first.resource == "high"
    second = pool.acquire(timeout=5, tenant="b", bind="job-1")
    assert second.resource == "low"
    pool.release(first)
    pool.release(second)
    again = pool.acquire(timeout=5, tenant="c", bind="job-1")
    assert again.resource == "low"  # bound, though "high" is free and better
    third = pool.acquire(timeout=5, tenant="a")
    assert third.resource == "high"
    fourth = pool.acquire(timeout=5, tenant="a")
    assert fourth.resource == "low"  # its second slot
    assert pool.acquire(timeout=0, tenant="b", blocking=False) is None
    assert pool.status().bind_hits == 1
    for lease in (again, third, fourth):
        pool.release(lease)


def test_a_dead_waiter_of_a_tenant_is_passed_over(
    admin: FairAllocator, clients: Callable[[], Clients]
) -> None:
    """The first waiter of the chosen tenant is killed: its grant is taken
    back once its client is gone, and the others are served."""
    admin.extend(["only"])
    admin.set_order("tenant")
    workers = clients()
    doomed, a, b = workers.new(), workers.new(), workers.new()
    held = admin.acquire(timeout=5)
    doomed.send(("queue", "X", "A", False))
    queued(admin, 1)
    a.send(("queue", "Y", "A", False))
    queued(admin, 2)
    b.send(("queue", "Z", "B", False))
    queued(admin, 3)
    doomed.kill()
    workers.procs.remove(doomed)
    admin.release(held)
    grants = workers.grants(2, timeout=60)
    assert {g["tag"] for g in grants} == {"Y", "Z"}
    wait_until(lambda: admin.status().waiting == 0, timeout=30, what="nobody waits")
    assert admin.status().leased == 0
    workers.stop()


def test_leases_and_status_show_tenants_under_fifo(pool: Any) -> None:
    """Under ``fifo`` a tenant is recorded and shown, nothing else: the
    order of service is arrival order."""
    pool.extend(["r1", "r2"])
    a = pool.acquire(timeout=5, tenant="crawler-a")
    b = pool.acquire(timeout=5)
    assert {(i.resource, i.tenant) for i in pool.leases()} == {
        (a.resource, "crawler-a"),
        (b.resource, ""),
    }
    waiter = Background(lambda: pool.acquire(timeout=30, tenant="crawler-b"))
    queued(pool, 1)
    status = pool.status()
    assert status.order == "fifo"
    rows = {t.name: t for t in status.tenants}
    assert rows["crawler-a"] == TenantStatus(name="crawler-a", leases=1, grants=1)
    assert rows[""].leases == 1 and rows[""].grants == 1
    assert rows["crawler-b"].waiting == 1 and rows["crawler-b"].grants == 0
    assert rows["crawler-b"].oldest_wait >= 0
    pool.release(a)
    got = waiter.join()
    assert {t.name: t.leases for t in pool.status().tenants}["crawler-b"] == 1
    pool.release(got)
    pool.release(b)


def test_the_allocators_default_tenant(factory: Any, pool_name: str) -> None:
    pool = factory.pool(pool_name, tenant="team-x")
    pool.extend(["r1", "r2"])
    mine = pool.acquire(timeout=5)
    other = pool.acquire(timeout=5, tenant="")
    assert {i.tenant for i in pool.leases()} == {"team-x", ""}
    pool.release(mine)
    pool.release(other)
    with pool.lease_many(2, timeout=5) as both:
        assert len(both) == 2
        assert [i.tenant for i in pool.leases()] == ["team-x", "team-x"]
    with pool.lease(timeout=5, tenant="team-y"):
        assert [i.tenant for i in pool.leases()] == ["team-y"]
    with pool.lease_many(1, timeout=5, tenant="team-z"):
        assert [i.tenant for i in pool.leases()] == ["team-z"]


# -- argument checks -----------------------------------------------------------------------


BAD_TENANTS: list[tuple[Any, type[Exception]]] = [
    (5, TypeError),
    (b"bytes", TypeError),
    ("x" * 201, ValueError),
    ("a\nb", ValueError),
    ("nul\x00", ValueError),
]

BAD_WEIGHTS: list[tuple[Any, type[Exception]]] = [
    (True, TypeError),
    ("3", TypeError),
    (None, TypeError),
    (0, ValueError),
    (0.001, ValueError),
    (101, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    (10**400, ValueError),
]


@pytest.fixture(params=["sync", "async"])
def unreachable(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An allocator whose server cannot be reached: a check that passed
    would end in a connection error, not the error of the check."""
    if request.param == "sync":
        yield FairAllocator(redis.Redis(port=1, socket_connect_timeout=0.2), "p")
        return
    import asyncio

    client = redis.asyncio.Redis(port=1, socket_connect_timeout=0.2)
    pool = AsyncFairAllocator(client, "p")

    class Run:
        def __getattr__(self, name: str) -> Any:
            attr = getattr(pool, name)

            def call(*args: Any, **kwargs: Any) -> Any:
                return asyncio.run(attr(*args, **kwargs))

            return call

    yield Run()


@pytest.mark.parametrize(("value", "error"), BAD_TENANTS)
def test_a_bad_tenant_is_refused_before_any_io(
    unreachable: Any, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="tenant"):
        unreachable.acquire(timeout=1, tenant=value)
    with pytest.raises(error, match="tenant"):
        unreachable.acquire_many(2, timeout=1, tenant=value)
    with pytest.raises(error, match="tenant"):
        unreachable.set_tenant_weight(value, 2)


@pytest.mark.parametrize(("value", "error"), BAD_TENANTS)
def test_a_bad_default_tenant_is_refused_at_construction(
    value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="tenant"):
        FairAllocator(redis.Redis(port=1), "p", tenant=value)


@pytest.mark.parametrize(("value", "error"), BAD_WEIGHTS)
def test_a_bad_weight_is_refused_before_any_io(
    unreachable: Any, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="weight"):
        unreachable.set_tenant_weight("a", value)


@pytest.mark.parametrize(
    ("value", "error"), [("lifo", ValueError), ("", ValueError), (1, TypeError), (None, TypeError)]
)
def test_a_bad_order_is_refused_before_any_io(
    unreachable: Any, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="order"):
        unreachable.set_order(value)


def test_weights_and_orders_at_their_bounds(pool: Any) -> None:
    pool.extend(["r"])
    pool.set_tenant_weight("ö" * 200, 100)
    pool.set_tenant_weight("", 0.01)
    pool.set_tenant_weight("z", 1)  # the default: nothing kept
    pool.set_order("tenant")
    pool.set_order("tenant")
    lease = pool.acquire(timeout=5, tenant="ö" * 200)
    pool.release(lease)
    rows = {t.name: t for t in pool.status().tenants}
    assert rows["ö" * 200].weight == 100 and rows[""].weight == 0.01
    assert "z" not in rows
    pool.set_order("fifo")
    pool.set_order("fifo")
    assert pool.status().order == "fifo"


def test_damaged_tenant_state_is_read_safely_and_gc_mends_it(
    admin: FairAllocator, redis_url: str
) -> None:
    """What a user of the pool may write by hand (lua/README.md, "Trust"):
    an order no script writes reads as fifo and gc makes it one; a damaged
    count or weight reads as 0 and 1; an index entry whose ticket is gone
    leaves the index when it is met. Nothing stops the pool."""
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = dict(zip(KEY_SUFFIXES, admin._pool.keys, strict=False))
    admin.extend(["only"])
    admin.set_order("tenant")
    raw.hset(keys["tenants"], mapping={"c|a": "garbage", "w|a": "nan"})
    held = admin.acquire(timeout=5, tenant="a")
    # A waiter that is in the index, and an entry of the index whose ticket
    # is gone (its member names a ticket no stream holds).
    waiter = Background(lambda: admin.acquire(timeout=30, tenant="b"))
    queued(admin, 1)
    raw.zadd(keys["tq"], {"00000000000000" + "0" * 24 + "1" + "ghost": 0})
    raw.zadd(keys["tw"], {"ghost\x00" + "0" * 24 + "1": 0})
    admin.release(held)
    admin.release(waiter.join())
    assert raw.zcard(keys["tq"]) == 0 and raw.zcard(keys["tw"]) == 0
    raw.hset(keys["meta"], "ord", "zz|not-an-id")
    assert admin.status().order == "fifo"
    admin.release(admin.acquire(timeout=5, tenant="a"))
    assert admin.gc().repaired >= 1
    mended = raw.hget(keys["meta"], "ord")
    # fifo; stepping over granted tickets up to the last pending one, if any.
    assert mended is None or re.fullmatch(r"\|\d+-\d+", mended), mended
    admin.release(admin.acquire(timeout=5))
    raw.close()
