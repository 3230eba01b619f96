"""The pool against a plain Python model of it, driven by hypothesis.

A ``RuleBasedStateMachine`` runs random sequences of non-blocking acquires,
releases (with and without quarantine), renewals, removals (forced or not),
extends (new resources, and capacity or priority changes of existing ones)
and gc runs on a real Redis, and the same operations on :class:`Model`. After
every step the pool's status must agree with the model, and every result
(which resource a grant picks, release's bool, renew's LeaseLost, the counts
of extend, remove and gc) must be the one the model predicts.

Ttls and quarantines are 600 s, so nothing ends by itself during a run: the
model needs no clock, and the test is deterministic (``derandomize``).

What the model encodes, from the guarantees (docs/concepts.md#guarantees):
a resource is free iff it is in rotation (not quarantined, not draining)
with a free slot; among free ones, the highest priority is granted first,
and among equals the one free for longest (a resource that was just
granted, or came back, goes to the back; resources that became free in the
same operation go by name); a draining resource leaves with its last lease;
a forced removal voids its leases; a resource added again continues its
token sequence.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from allocator import FairAllocator, Lease, LeaseLost

pytestmark = pytest.mark.real_redis

LONG = 600.0
NAMES = ("r0", "r1", "r2")


@attrs.define
class Res:
    cap: int
    priority: int
    gen: int
    used: int = 0
    state: str = "a"  # a: in rotation, q: quarantined, d: draining
    #: When it entered the free set (operation number), None while not free.
    stamp: int | None = None


@attrs.define
class Held:
    lease: Lease
    gen: int
    #: live | void (its resource was force-removed; the record is still
    #: there until something touches it) | ended
    state: str = "live"


class Model:
    def __init__(self) -> None:
        self.res: dict[str, Res] = {}
        self.held: list[Held] = []
        self.last_token: dict[str, int] = {}
        self.op = 0
        self.gens = 0

    def tick(self) -> None:
        self.op += 1  # every operation is one script run, at a later server time

    def place(self, r: Res, restamp: bool) -> None:
        want = r.state == "a" and r.used < r.cap
        if r.stamp is not None and (restamp or not want):
            r.stamp = None
        if want and r.stamp is None:
            r.stamp = self.op

    def retire(self, name: str) -> None:
        gen = self.res.pop(name).gen
        for h in self.held:
            if h.state == "live" and h.lease.resource == name and h.gen == gen:
                h.state = "void"

    def settle(self, name: str, r: Res) -> None:
        if r.state == "d" and r.used <= 0:
            self.retire(name)
        else:
            self.place(r, False)

    def extend(self, names: list[str], cap: int, priority: int) -> int:
        self.tick()
        added = 0
        for name in names:
            r = self.res.get(name)
            if r is None:
                self.gens += 1
                r = self.res[name] = Res(cap=cap, priority=priority, gen=self.gens)
                added += 1
                self.place(r, False)
            else:
                restamp = r.priority != priority
                r.cap, r.priority = cap, priority
                if r.state == "d":
                    r.state = "a"
                self.place(r, restamp)
        return added

    def choose(self) -> str | None:
        free = [(-r.priority, r.stamp, name) for name, r in self.res.items() if r.stamp is not None]
        return min(free)[2] if free else None

    def grant(self, lease: Lease) -> None:
        r = self.res[lease.resource]
        r.used += 1
        self.place(r, True)
        self.held.append(Held(lease, r.gen))
        self.last_token[lease.resource] = lease.token

    def end(self, h: Held) -> tuple[bool, str | None]:
        """End a lease record; (was it live, its resource if it still counts)."""
        was = h.state
        h.state = "ended"
        return was == "live", h.lease.resource if was == "live" else None

    def release(self, h: Held, quarantine: bool) -> bool:
        self.tick()
        live, name = self.end(h)
        if name is None:
            return False
        r = self.res[name]
        r.used -= 1
        if quarantine and r.state != "d":
            r.state = "q"
        self.settle(name, r)
        return live

    def renew(self, h: Held) -> bool:
        self.tick()
        if h.state == "live":
            return True
        h.state = "ended"
        return False

    def remove(self, names: list[str], force: bool) -> int:
        self.tick()
        n = 0
        for name in names:
            r = self.res.get(name)
            if r is None:
                continue
            n += 1
            if force or r.used <= 0:
                self.retire(name)
            else:
                r.state = "d"
                self.place(r, False)
        return n

    def gc(self) -> int:
        """Nothing is due (long ttls); gc ends the void lease records, which
        were counted among the revoked when their resource was removed (a
        holder told of it may never ask the server again): none is
        reclaimed."""
        self.tick()
        for h in self.held:
            if h.state == "void":
                h.state = "ended"
        return 0


names_st = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True)


class PoolMachine(RuleBasedStateMachine):
    url: str = ""

    #: The pool's order (docs/concepts.md#tenants): under "tenant", requests
    #: name tenants; which resource a grant picks, and every count, must be
    #: what the model says all the same (a priority orders resources, not
    #: tenants), and the leases per tenant add up.
    order = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self.client = redis.Redis.from_url(self.url)
        self.pool = FairAllocator(self.client, f"model-{uuid.uuid4().hex[:12]}", lease_ttl=LONG)
        if self.order != "fifo":
            self.pool.set_order(self.order)
        self.model = Model()
        #: The tenant of each lease acquired (by lease id).
        self.tenant_of: dict[str, str] = {}

    def teardown(self) -> None:
        self.client.close()

    def pick(self, index: int) -> Held | None:
        if not self.model.held:
            return None
        return self.model.held[index % len(self.model.held)]

    @rule(names=names_st, cap=st.integers(1, 3), priority=st.sampled_from([0, 0, 1]))
    def extend(self, names: list[str], cap: int, priority: int) -> None:
        added = self.pool.extend(names, capacity=cap, priority=priority)
        assert added == self.model.extend(names, cap, priority)

    @rule(tenant=st.sampled_from(["", "", "a", "b"]))
    def acquire(self, tenant: str) -> None:
        named = {"tenant": tenant} if self.order != "fifo" else {}
        lease = self.pool.acquire(blocking=False, ttl=LONG, **named)
        self.model.tick()
        expected = self.model.choose()
        if expected is None:
            assert lease is None
            return
        assert lease is not None, f"expected a grant of {expected}"
        assert lease.resource == expected
        previous = self.model.last_token.get(lease.resource)
        assert previous is None or lease.token > previous, (previous, lease.token)
        self.model.grant(lease)
        self.tenant_of[lease.id] = tenant if self.order != "fifo" else ""

    @rule(index=st.integers(0, 1000), quarantine=st.booleans())
    def release(self, index: int, quarantine: bool) -> None:
        h = self.pick(index)
        if h is None:
            return
        got = self.pool.release(h.lease, quarantine=LONG if quarantine else None)
        assert got is self.model.release(h, quarantine)

    @rule(index=st.integers(0, 1000))
    def renew(self, index: int) -> None:
        h = self.pick(index)
        if h is None:
            return
        expected = self.model.renew(h)
        try:
            renewed = self.pool.renew(h.lease)
        except LeaseLost:
            assert not expected, "renew raised LeaseLost on a live lease"
        else:
            assert expected, "renew succeeded on a lease that is not held"
            assert renewed.token == h.lease.token and renewed.resource == h.lease.resource

    @rule(names=st.lists(st.sampled_from((*NAMES, "nope")), min_size=1, max_size=3, unique=True),
          force=st.booleans())  # fmt: skip
    def remove(self, names: list[str], force: bool) -> None:
        assert self.pool.remove(names, force=force) == self.model.remove(names, force)

    @rule()
    def gc(self) -> None:
        report = self.pool.gc()
        assert report.reclaimed == self.model.gc()
        assert report.dropped_waiters == 0 and report.expired_bindings == 0

    @invariant()
    def status_agrees(self) -> None:
        status = self.pool.status()
        model = self.model
        assert status.size == len(model.res)
        assert status.free == sum(1 for r in model.res.values() if r.stamp is not None)
        assert status.leased == sum(r.used for r in model.res.values())
        assert status.waiting == 0
        rows = {row.name: row for row in status.resources}
        assert set(rows) == set(model.res)
        for name, r in model.res.items():
            row = rows[name]
            if r.state == "d":
                state = "draining"
            elif r.state == "q":
                state = "quarantined"
            else:
                state = "free" if r.used < r.cap else "leased"
            got: Any = (row.capacity, row.priority, row.leases, row.state)
            assert got == (r.cap, r.priority, r.used, state), name
        live = sum(1 for h in model.held if h.state == "live")
        assert live == status.leased
        if self.order != "fifo":
            assert status.order == self.order
            per_tenant: dict[str, int] = {}
            for h in model.held:
                if h.state == "live":
                    name = self.tenant_of[h.lease.id]
                    per_tenant[name] = per_tenant.get(name, 0) + 1
            shown = {t.name: t.leases for t in status.tenants if t.leases}
            assert shown == per_tenant


@pytest.mark.slow  # random runs of the state machine: about half a minute each
@pytest.mark.parametrize(("order", "examples"), [("fifo", 200), ("tenant", 60)])
def test_pool_matches_the_model(redis_url: str, order: str, examples: int) -> None:
    PoolMachine.url = redis_url
    PoolMachine.order = order
    run_state_machine_as_test(
        PoolMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
