"""Chaos with several resources at once: single and multi requests, SIGKILLs.

Like tests/test_chaos.py, on a pool of four resources (one of capacity 2):
workers (``_workers.chaos_many_worker``) ask for one to three resources
at a time, with ``acquire`` or ``acquire_many``, and write every lease to a
ledger of their own; the test kills one at random now and then and starts a
replacement. Checked on the ledgers:

- no resource ever had more holders at once than its capacity (a killed
  holder counts until its lease's deadline);
- tokens never repeat and grow per resource in grant order;
- every grant is whole: the leases of one request are distinct resources,
  granted at the same server instant, as many as asked for (only the last
  grant of a killed worker may be cut short in its ledger);
- the pool ends whole.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from _workers import CTX, chaos_many_worker, server_now
from helpers import wait_until

from allocator import FairAllocator
from allocator._core.liveness import ALIVE
from allocator._core.presence import GRACE

pytestmark = [pytest.mark.real_redis, pytest.mark.slow]

SEED = 20261123
RESOURCES = {"a": 1, "b": 1, "c": 2, "d": 1}
WORKERS = 5
TTL = 1.5
HOLD = 0.3
KILL_PHASE = 8.0
PICKUP = 2.0


class Worker:
    def __init__(self, url: str, name: str, folder: Path, number: int, stop: Any) -> None:
        self.ledger = folder / f"ledger-{number:03d}.jsonl"
        self.process = CTX.Process(
            target=chaos_many_worker,
            args=(url, name, str(self.ledger), SEED * 1000 + number, stop, TTL, HOLD),
            daemon=True,
        )
        self.process.start()
        self.killed = False


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    made: list[Worker] = []
    yield made
    for worker in made:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(10)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    lines = path.read_text(encoding="utf-8").split("\n")
    for number, line in enumerate(lines):
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                assert number == len(lines) - 1, f"{path}: a bad line that is not the last"
    return records


def test_chaos_single_and_multi(
    redis_url: str, pool_name: str, workers: list[Worker], tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    pool = FairAllocator(client, pool_name, lease_ttl=TTL)
    for resource, capacity in RESOURCES.items():
        pool.extend([resource], capacity=capacity)
    stop = CTX.RawValue("i", 0)
    rng = random.Random(SEED)
    folder = tmp_path / "ledgers"
    folder.mkdir()
    numbers = iter(range(10_000))
    live = [Worker(redis_url, pool_name, folder, next(numbers), stop) for _ in range(WORKERS)]
    workers.extend(live)
    wait_until(lambda: any(w.ledger.exists() for w in live), timeout=30, what="a first lease")

    ends = time.monotonic() + KILL_PHASE
    last_kill = server_now(client)
    while time.monotonic() < ends:
        time.sleep(rng.uniform(0.2, 1.0))
        victim = live.pop(rng.randrange(len(live)))
        victim.process.kill()
        victim.process.join(10)
        victim.killed = True
        last_kill = server_now(client)
        fresh = Worker(redis_url, pool_name, folder, next(numbers), stop)
        live.append(fresh)
        workers.append(fresh)

    settled = last_kill + max(TTL, ALIVE + PICKUP) + 1.0
    wait_until(lambda: server_now(client) > settled, timeout=30, what="dead workers' leases ended")
    stop.value = 1
    for worker in live:
        worker.process.join(30)
        assert worker.process.exitcode == 0, f"survivor ended with {worker.process.exitcode}"
    # A dead waiter deep in the queue (never at its head) is first found
    # absent by a gc, which starts its presence grace; the next gc after
    # the grace drops it.
    pool.gc()
    graced = server_now(client) + GRACE
    wait_until(lambda: server_now(client) > graced, timeout=10, what="the presence grace")
    pool.gc()
    status = pool.status()

    # Grants and their leases, from the ledgers.
    leases: list[dict[str, Any]] = []
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    last_group: dict[int, tuple[int, int]] = {}
    for number, worker in enumerate(workers):
        by_token: dict[tuple[str, int], dict[str, Any]] = {}
        for rec in read_ledger(worker.ledger):
            key = (rec["resource"], rec["token"])
            if rec["kind"] == "begin":
                rec = {**rec, "killed": worker.killed}
                by_token[key] = rec
                leases.append(rec)
                groups[(number, rec["group"])].append(rec)
                last_group[number] = (number, rec["group"])
            elif rec["kind"] == "renew":
                by_token[key]["expires_at"] = rec["expires_at"]
            elif rec["kind"] == "end":
                by_token[key]["end"] = rec["end"]
    multi = [g for g in groups.values() if g[0]["count"] > 1]
    assert len(leases) > 20 and len(multi) > 5, "too little happened to tell anything"

    # Every grant is whole.
    for key, group in groups.items():
        count = group[0]["count"]
        cut = workers[key[0]].killed and last_group[key[0]] == key
        assert len(group) == count or (cut and len(group) < count), group
        assert len({rec["resource"] for rec in group}) == len(group), group
        assert len({rec["granted_at"] for rec in group}) == 1, group

    # Capacity: a holder counts from its start until its end, never past its
    # deadline; a killed one until its deadline.
    def until(rec: dict[str, Any]) -> float:
        return min(rec.get("end", rec["expires_at"]), rec["expires_at"])

    for resource, capacity in RESOURCES.items():
        mine = [rec for rec in leases if rec["resource"] == resource]
        for rec in mine:
            inside = [o for o in mine if o["start"] <= rec["start"] < until(o)]
            assert len(inside) <= capacity, (resource, [(o["token"], o["start"]) for o in inside])
        ordered = sorted(mine, key=lambda rec: rec["granted_at"])
        tokens = [rec["token"] for rec in ordered]
        assert len(set(tokens)) == len(tokens), f"{resource}: a token was granted twice"
        for before, after in itertools.pairwise(ordered):
            if after["granted_at"] > before["granted_at"]:
                assert after["token"] > before["token"], (resource, before, after)

    assert (status.size, status.free, status.leased, status.waiting) == (4, 4, 0, 0), status
    print(f"\n[chaos-many] leases={len(leases)} multi grants={len(multi)}")
    client.close()
