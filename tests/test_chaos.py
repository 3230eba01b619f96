"""Chaos: workers lease, hold and release on a small pool while being SIGKILLed
and SIGSTOPped at random, with a gc job running.

Worker processes (``_workers.chaos_worker``) lease from a pool of three
resources (two exclusive, one of capacity 2) with short ttls, and write every
lease to a ledger of their own, fsync'ed, with times read on the Redis server
inside the lease. Every other worker uses ``reclaim_on_disconnect`` with a
longer ttl (its dead holders' leases end about 1.5 s after their death, well
before their deadline). For about 12 s the test kills a random worker (seeded
choice and pace) and starts a replacement, or stops one for up to 3 s (it
keeps its place and its leases); a ``gc_loop`` process runs ``gc()``
meanwhile. Then the survivors go on for as long as it takes every lease and
grant of a dead worker to run out, and stop.

Checked on the ledgers, not on the library's own bookkeeping:

- no resource ever had more holders at once than its capacity, where a
  holder counts until the end of its lease (a stopped one too) or its death;
- a killed holder without the option held its resource until its lease's
  deadline (nothing was granted again before it); one with the option had
  it back before its deadline;
- fencing tokens strictly grow per resource, in grant order;
- FIFO: leases were granted in the order of their tickets (the order in
  which their requests queued);
- the pool ends whole: after the survivors finish and one ``gc()``, every
  resource is free and nobody waits.

Recovery times (death of a holder -> next grant of its resource) are printed
and written to ``chaos_recovery.json`` in the pytest temporary directory.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from _workers import CTX, chaos_worker, gc_loop, server_now
from helpers import ticket_key, wait_until

from allocator import FairAllocator
from allocator._core.liveness import ALIVE
from allocator._core.presence import GRACE

pytestmark = [pytest.mark.real_redis, pytest.mark.slow]

SEED = 20240611
RESOURCES = {"a": 1, "b": 1, "c": 2}
WORKERS = 5
TTL = 1.5
#: The ttl of the workers with ``reclaim_on_disconnect``: long enough that a
#: lease ended by its holder's death is told from one that expired.
RECLAIM_TTL = 6.0
#: Longest SIGSTOP: well inside the liveness mark of a client with a
#: presence (ALIVE_PRESENT), so a stopped waiter keeps its place.
STOP = 3.0
HOLD = 0.4  # longest hold between two steps of a lease
KILL_PHASE = 12.0
#: A grant pushed to a waiter is taken back if not picked up within this
#: (lua/prelude_defaults.lua PICKUP_MS).
PICKUP = 2.0


class Worker:
    def __init__(
        self, url: str, name: str, folder: Path, number: int, stop: Any, tenants: int = 1
    ) -> None:
        self.ledger = folder / f"ledger-{number:03d}.jsonl"
        self.reclaim = number % 2 == 1
        # With two tenants, each has workers with and without reclaim.
        self.tenant = "" if tenants == 1 else "ab"[(number // 2) % tenants]
        self.ttl = RECLAIM_TTL if self.reclaim else TTL
        self.process = CTX.Process(
            target=chaos_worker,
            # (It holds longer too, so that kills often find it holding.)
            args=(
                url,
                name,
                str(self.ledger),
                SEED * 1000 + number,
                stop,
                self.ttl,
                HOLD * (3 if self.reclaim else 1),
            ),
            kwargs={"reclaim": self.reclaim, "tenant": self.tenant},
            daemon=True,
        )
        self.process.start()
        self.pid: int = self.process.pid  # type: ignore[assignment]
        self.killed_at: float | None = None
        self.resume_at = 0.0


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    made: list[Worker] = []
    yield made
    for worker in made:
        if worker.process.is_alive():
            worker.process.kill()  # a stopped process dies of it too
        worker.process.join(10)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The records of one ledger; a last line cut short by SIGKILL is left out."""
    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    lines = path.read_text(encoding="utf-8").split("\n")
    for number, line in enumerate(lines):
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            assert number == len(lines) - 1, f"{path}: a bad line that is not the last"
    return records


class Held:
    """One grant, as its holder's ledger tells it."""

    def __init__(self, begin: dict[str, Any], worker: Worker) -> None:
        self.resource: str = begin["resource"]
        self.token: int = begin["token"]
        self.ticket: str = begin["ticket"]
        self.granted_at: float = begin["granted_at"]
        self.start: float = begin["start"]
        self.expires_at: float = begin["expires_at"]
        self.end: float | None = None
        self.released: bool | None = None
        self.worker = worker

    @property
    def until(self) -> float:
        """Until when this holder was inside: its end, but never past its
        lease's deadline; a holder that never ended was killed, and counts
        until its death or its deadline, whichever came first (a stopped
        holder lives: it counts to its end)."""
        if self.end is None:
            return min(self.expires_at, self.worker.killed_at or self.expires_at)
        return min(self.end, self.expires_at)


def collect(workers: list[Worker]) -> list[Held]:
    grants: list[Held] = []
    for worker in workers:
        current: Held | None = None
        for rec in read_ledger(worker.ledger):
            if rec["kind"] == "begin":
                current = Held(rec, worker)
                grants.append(current)
                continue
            assert current is not None and rec["token"] == current.token, rec
            if rec["kind"] == "renew":
                current.expires_at = rec["expires_at"]
            elif rec["kind"] == "end":
                current.end = rec["end"]
            elif rec["kind"] == "release":
                current.released = rec["released"]
    return grants


def over_capacity(grants: list[Held]) -> list[tuple[str, list[tuple[int, float, float]]]]:
    """Moments where a resource had more holders than its capacity."""
    problems = []
    for resource, capacity in RESOURCES.items():
        mine = [g for g in grants if g.resource == resource]
        for g in mine:
            inside = [h for h in mine if h.start <= g.start < h.until]
            if len(inside) > capacity:
                problems.append((resource, [(h.token, h.start, h.until) for h in inside]))
    return problems


@pytest.mark.parametrize("order", ["fifo", "tenant"])
def test_chaos(
    redis_url: str, pool_name: str, workers: list[Worker], tmp_path: Path, order: str
) -> None:
    """The same chaos in both orders of a pool: under ``tenant`` the workers
    name two tenants, and FIFO holds within each."""
    client = redis.Redis.from_url(redis_url)
    pool = FairAllocator(client, pool_name, lease_ttl=TTL)
    for resource, capacity in RESOURCES.items():
        pool.extend([resource], capacity=capacity)
    tenants = 1
    if order == "tenant":
        pool.set_order("tenant")
        tenants = 2
    stop = CTX.RawValue("i", 0)  # lock-free: a killed worker holds no lock
    rng = random.Random(SEED)
    folder = tmp_path / "ledgers"
    folder.mkdir()
    numbers = iter(range(10_000))
    live = [
        Worker(redis_url, pool_name, folder, next(numbers), stop, tenants) for _ in range(WORKERS)
    ]
    workers.extend(live)
    wait_until(lambda: any(w.ledger.exists() for w in live), timeout=30, what="a first lease")

    gc_in, gc_out = CTX.Queue(), CTX.Queue()
    gc_job = CTX.Process(target=gc_loop, args=(redis_url, pool_name, gc_in, gc_out, 0.3))
    gc_job.start()

    # Kill or stop at random (a killed worker is replaced); the pace, the
    # victims and the stops come from SEED.
    ends = time.monotonic() + KILL_PHASE
    last_kill = server_now(client)
    stops = 0
    while time.monotonic() < ends:
        time.sleep(rng.uniform(0.2, 1.0))
        for worker in live:  # stops that are over
            if worker.resume_at and time.monotonic() >= worker.resume_at:
                os.kill(worker.pid, signal.SIGCONT)
                worker.resume_at = 0.0
        running = [w for w in live if not w.resume_at]
        victim = running[rng.randrange(len(running))]
        if rng.random() < 0.35:
            os.kill(victim.pid, signal.SIGSTOP)
            victim.resume_at = time.monotonic() + rng.uniform(0.5, STOP)
            stops += 1
            continue
        live.remove(victim)
        victim.process.kill()
        victim.process.join(10)
        victim.killed_at = last_kill = server_now(client)
        fresh = Worker(redis_url, pool_name, folder, next(numbers), stop, tenants)
        live.append(fresh)
        workers.append(fresh)
    for worker in live:
        if worker.resume_at:
            os.kill(worker.pid, signal.SIGCONT)
            worker.resume_at = 0.0

    # The survivors go on until whatever a dead worker held or was granted
    # has run out: its leases (ttl), and grants pushed to it while it still
    # looked alive (liveness window, then the pick-up window).
    settled = last_kill + max(RECLAIM_TTL, ALIVE + PICKUP) + 1.0
    wait_until(lambda: server_now(client) > settled, timeout=30, what="dead workers' leases ended")
    stop.value = 1
    gc_in.put("stop")
    while gc_out.get(timeout=30)[0] != "stopped":
        pass
    gc_job.join(30)
    for worker in live:
        worker.process.join(30)
        assert worker.process.exitcode == 0, (
            f"survivor {worker.pid} ended with {worker.process.exitcode}"
        )

    # A dead waiter deep in the queue (never at its head) is first found
    # absent by a gc, which starts its presence grace; the next gc after
    # the grace drops it.
    pool.gc()
    graced = server_now(client) + GRACE
    wait_until(lambda: server_now(client) > graced, timeout=10, what="the presence grace")
    report = pool.gc()
    status = pool.status()
    grants = collect(workers)
    kills = [w for w in workers if w.killed_at is not None]

    # Recovery: a holder killed inside its lease -> the next grant of its
    # resource, with and without reclaim_on_disconnect.
    recovery: dict[bool, list[float]] = {False: [], True: []}
    after_deadline: dict[bool, list[float]] = {False: [], True: []}
    for g in grants:
        if g.end is not None or g.worker.killed_at is None:
            continue
        later = [h for h in grants if h.resource == g.resource and h.granted_at > g.granted_at]
        if RESOURCES[g.resource] == 1 and later:
            nxt = min(later, key=lambda h: h.granted_at)
            recovery[g.worker.reclaim].append(nxt.granted_at - g.worker.killed_at)
            after_deadline[g.worker.reclaim].append(nxt.granted_at - g.expires_at)

    def summary(values: list[float]) -> dict[str, float]:
        if not values:
            return {}
        return {
            "count": len(values),
            "min": round(min(values), 3),
            "median": round(statistics.median(values), 3),
            "max": round(max(values), 3),
        }

    results = {
        "grants": len(grants),
        "kills": len(kills),
        "killed_holding": sum(1 for g in grants if g.end is None),
        "lost_at_release": sum(1 for g in grants if g.released is False),
        "stops": stops,
        "holder death -> next grant (s)": summary(recovery[False]),
        "lease deadline -> next grant (s)": summary(after_deadline[False]),
        "reclaim_on_disconnect: holder death -> next grant (s)": summary(recovery[True]),
        "reclaim_on_disconnect: lease deadline -> next grant (s)": summary(after_deadline[True]),
        "final gc": {"reclaimed": report.reclaimed, "dropped_waiters": report.dropped_waiters},
    }
    out = Path(tmp_path.parent) / "chaos_recovery.json"
    out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"\n[chaos] {json.dumps(results)}\n[chaos] written to {out}")

    assert len(grants) > 20, "too few leases to tell anything"
    assert kills
    # Safety: never more holders at once than the capacity.
    problems = over_capacity(grants)
    if problems:
        # Keep the evidence whole: every record of the resources involved.
        evidence = tmp_path / "over_capacity.json"
        involved = {resource for resource, _ in problems}
        evidence.write_text(json.dumps({
            "problems": problems,
            "grants": [
                {**vars(g), "worker": g.worker.pid, "killed_at": g.worker.killed_at}
                for g in grants if g.resource in involved
            ],
        }, indent=1))  # fmt: skip
        raise AssertionError(f"over capacity: {problems[:3]} (all records: {evidence})")
    # Fencing: tokens are unique per resource, and strictly grow in grant order.
    for resource in RESOURCES:
        mine = sorted((g for g in grants if g.resource == resource), key=lambda g: g.granted_at)
        tokens = [g.token for g in mine]
        assert len(set(tokens)) == len(tokens), f"{resource}: a token was granted twice"
        for before, after in itertools.pairwise(mine):
            if after.granted_at > before.granted_at:
                assert after.token > before.token, (resource, before.token, after.token)
    # A dead holder's lease ended at its deadline, or before it where it
    # asked for that (about 1.5 s after its death, with a ttl of 6 s).
    assert all(t >= 0 for t in after_deadline[False]), after_deadline[False]
    assert all(t < 0 for t in after_deadline[True]), after_deadline[True]
    # FIFO: leases were granted in the order their requests queued (under
    # the tenant order, within each tenant).
    for tenant in {g.worker.tenant for g in grants}:
        mine = [g for g in grants if g.worker.tenant == tenant]
        by_ticket = sorted(mine, key=lambda g: ticket_key(g.ticket))
        for before, after in itertools.pairwise(by_ticket):
            assert before.granted_at <= after.granted_at, (tenant, before.ticket, after.ticket)
    if order == "tenant":
        assert {g.worker.tenant for g in grants} == {"a", "b"}
        assert pool.status().order == "tenant"
    # A lease that was released live never overlapped its deadline.
    for g in grants:
        if g.released and g.end is not None:
            assert g.end <= g.expires_at, (g.resource, g.token)
    # The pool is whole again.
    assert (status.size, status.free, status.leased, status.waiting) == (3, 3, 0, 0), status
    for row in status.resources:
        assert row.leases == 0 and row.state == "free", row
    client.close()
