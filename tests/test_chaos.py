"""Chaos: workers lease, hold and release on a small pool while being SIGKILLed at random.

Worker processes (``_workers.chaos_worker``) lease from a pool of three
resources (two exclusive, one of capacity 2) with short ttls, and write every
lease to a ledger of their own, fsync'ed, with times read on the Redis server
inside the lease. For about 12 s the test kills a random worker (seeded
choice and pace) and starts a replacement; then the survivors go on for as
long as it takes every lease and grant of a dead worker to run out, and stop.

Checked on the ledgers, not on the library's own bookkeeping:

- no resource ever had more holders at once than its capacity, where a
  killed holder counts until its lease's deadline;
- fencing tokens strictly grow per resource, in grant order;
- the pool ends whole: after the survivors finish and one ``gc()``, every
  resource is free and nobody waits.

Recovery times (death of a holder -> next grant of its resource) are printed
and written to ``chaos_recovery.json`` in the pytest temporary directory.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from _workers import CTX, chaos_worker, server_now
from helpers import wait_until

from allocator import FairAllocator
from allocator._core.liveness import ALIVE, GRACE

pytestmark = pytest.mark.real_redis

SEED = 20240611
RESOURCES = {"a": 1, "b": 1, "c": 2}
WORKERS = 5
TTL = 1.5
HOLD = 0.4  # longest hold between two steps of a lease
KILL_PHASE = 12.0
#: A grant pushed to a waiter is taken back if not picked up within this
#: (lua/prelude.lua PICKUP_MS).
PICKUP = 2.0


class Worker:
    def __init__(self, url: str, name: str, folder: Path, number: int, stop: Any) -> None:
        self.ledger = folder / f"ledger-{number:03d}.jsonl"
        self.process = CTX.Process(
            target=chaos_worker,
            args=(url, name, str(self.ledger), SEED * 1000 + number, stop, TTL, HOLD),
            daemon=True,
        )
        self.process.start()
        self.pid: int = self.process.pid  # type: ignore[assignment]
        self.killed_at: float | None = None


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    made: list[Worker] = []
    yield made
    for worker in made:
        if worker.process.is_alive():
            worker.process.kill()
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
        self.granted_at: float = begin["granted_at"]
        self.start: float = begin["start"]
        self.expires_at: float = begin["expires_at"]
        self.end: float | None = None
        self.released: bool | None = None
        self.worker = worker

    @property
    def until(self) -> float:
        """Until when this holder was inside: its end, but never past its
        lease's deadline; a holder that never ended was killed and counts
        until its deadline."""
        if self.end is None:
            return self.expires_at
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


def test_chaos(redis_url: str, pool_name: str, workers: list[Worker], tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    pool = FairAllocator(client, pool_name, lease_ttl=TTL)
    for resource, capacity in RESOURCES.items():
        pool.extend([resource], capacity=capacity)
    stop = CTX.RawValue("i", 0)  # lock-free: a killed worker holds no lock
    rng = random.Random(SEED)
    folder = tmp_path / "ledgers"
    folder.mkdir()
    numbers = iter(range(10_000))
    live = [Worker(redis_url, pool_name, folder, next(numbers), stop) for _ in range(WORKERS)]
    workers.extend(live)
    wait_until(lambda: any(w.ledger.exists() for w in live), timeout=30, what="a first lease")

    # Kill at random, and replace; the pace and the victims come from SEED.
    ends = time.monotonic() + KILL_PHASE
    last_kill = server_now(client)
    while time.monotonic() < ends:
        time.sleep(rng.uniform(0.2, 1.0))
        victim = live.pop(rng.randrange(len(live)))
        victim.process.kill()
        victim.process.join(10)
        victim.killed_at = last_kill = server_now(client)
        fresh = Worker(redis_url, pool_name, folder, next(numbers), stop)
        live.append(fresh)
        workers.append(fresh)

    # The survivors go on until whatever a dead worker held or was granted
    # has run out: its leases (ttl), and grants pushed to it while it still
    # looked alive (liveness window, then the pick-up window).
    settled = last_kill + max(TTL, ALIVE + PICKUP) + 1.0
    wait_until(lambda: server_now(client) > settled, timeout=30, what="dead workers' leases ended")
    stop.value = 1
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

    # Recovery: a holder killed inside its lease -> the next grant of its resource.
    recovery, after_deadline = [], []
    for g in grants:
        if g.end is not None or g.worker.killed_at is None:
            continue
        later = [h for h in grants if h.resource == g.resource and h.granted_at > g.granted_at]
        if RESOURCES[g.resource] == 1 and later:
            nxt = min(later, key=lambda h: h.granted_at)
            recovery.append(nxt.granted_at - g.worker.killed_at)
            after_deadline.append(nxt.granted_at - g.expires_at)

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
        "holder death -> next grant (s)": summary(recovery),
        "lease deadline -> next grant (s)": summary(after_deadline),
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
    # A lease that was released live never overlapped its deadline.
    for g in grants:
        if g.released and g.end is not None:
            assert g.end <= g.expires_at, (g.resource, g.token)
    # The pool is whole again.
    assert (status.size, status.free, status.leased, status.waiting) == (3, 3, 0, 0), status
    for row in status.resources:
        assert row.leases == 0 and row.state == "free", row
    client.close()
