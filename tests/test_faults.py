"""Faults, each in turn, under a busy pool: the pool stays safe and ends whole.

Worker processes (``_workers.fault_worker``) lease, hold and release on a
pool of three resources (two exclusive, one of capacity 2), each writing
every lease to an fsync'ed ledger of its own with times read on the server.
Meanwhile the test puts the server through one fault after another, twice
over: its clients' connections killed (``CLIENT KILL``), all clients paused
(``CLIENT PAUSE``), the server frozen (``DEBUG SLEEP``), its scripts flushed
(``SCRIPT FLUSH``), a restart with persistence (appendonly, fsync always),
and a holder's process stopped (SIGSTOP) past its lease's ttl, then let go.

Checked on the ledgers: never more holders at once than a resource's
capacity (a holder counts until its end or its lease's deadline, whichever
is first), fencing tokens unique and growing per resource, every worker
ends cleanly (a NOSCRIPT or any other non-transport error reaching a worker
ends it with a traceback), and after the workers stop and one ``gc()``, the
pool is whole: every resource free, nobody waiting.

Marked ``faults``: it runs with the suite (and in CI) in about half a
minute; ``pytest -m "not faults"`` leaves it out.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from _workers import CTX, fault_worker, server_now
from helpers import wait_until
from test_chaos import RESOURCES, Held, over_capacity, read_ledger

from allocator import FairAllocator
from allocator._core.liveness import ALIVE
from allocator._core.presence import GRACE
from allocator._server import RedisServer

pytestmark = [pytest.mark.real_redis, pytest.mark.faults, pytest.mark.slow]

WORKERS = 5
TTL = 1.5
HOLD = 0.3
PICKUP = 2.0  # lua/prelude_defaults.lua PICKUP_MS
ROUNDS = 2


class Worker:
    def __init__(self, url: str, name: str, folder: Path, number: int, stop: Any) -> None:
        self.ledger = folder / f"ledger-{number:03d}.jsonl"
        self.killed_at: float | None = None
        self.process = CTX.Process(
            target=fault_worker,
            args=(url, name, str(self.ledger), 8000 + number, stop, TTL, HOLD),
            daemon=True,
        )
        self.process.start()
        self.pid: int = self.process.pid  # type: ignore[assignment]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True, extra_args=["--enable-debug-command", "yes"]) as made:
        yield made


def collect(workers: list[Worker]) -> tuple[list[Held], list[dict[str, Any]]]:
    grants: list[Held] = []
    errors: list[dict[str, Any]] = []
    for worker in workers:
        current: Held | None = None
        for rec in read_ledger(worker.ledger):
            if rec["kind"] == "error":
                errors.append(rec)
            elif rec["kind"] == "begin":
                current = Held(rec, worker)  # type: ignore[arg-type]
                grants.append(current)
            else:
                assert current is not None and rec["token"] == current.token, rec
                if rec["kind"] == "renew":
                    current.expires_at = rec["expires_at"]
                elif rec["kind"] == "end":
                    current.end = rec["end"]
                elif rec["kind"] == "release":
                    current.released = rec["released"]
    return grants, errors


def grants_so_far(workers: list[Worker]) -> int:
    return sum(1 for w in workers for r in read_ledger(w.ledger) if r["kind"] == "begin")


def test_faults_in_turn(server: RedisServer, pool_name: str, tmp_path: Path) -> None:
    admin = redis.Redis.from_url(server.url)
    pool = FairAllocator(admin, pool_name, lease_ttl=TTL)
    for resource, capacity in RESOURCES.items():
        pool.extend([resource], capacity=capacity)
    stop = CTX.RawValue("i", 0)
    folder = tmp_path / "ledgers"
    folder.mkdir()
    workers = [Worker(server.url, pool_name, folder, i, stop) for i in range(WORKERS)]
    done: list[str] = []
    try:
        wait_until(lambda: grants_so_far(workers) >= 5, timeout=60, what="first leases")

        def busy_again(what: str) -> None:
            """After a fault: the pool serves again (some new grants)."""
            before = grants_so_far(workers)
            wait_until(lambda: grants_so_far(workers) >= before + 3, timeout=60, what=what)
            done.append(what)

        def stop_a_holder() -> None:
            # A worker frozen while it holds (or waits): its lease runs out
            # and is granted on; when it wakes, its release finds it lost.
            victim = workers[len(done) % WORKERS]
            os.kill(victim.pid, signal.SIGSTOP)
            frozen_until = server_now(admin) + TTL + 1.0
            wait_until(lambda: server_now(admin) > frozen_until, timeout=30, what="ttl")
            os.kill(victim.pid, signal.SIGCONT)

        faults = [
            ("client kill", lambda: admin.execute_command(
                "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")),
            ("client pause", lambda: admin.execute_command("CLIENT", "PAUSE", "700", "ALL")),
            ("debug sleep", lambda: admin.execute_command("DEBUG", "SLEEP", "0.7")),
            ("script flush", lambda: admin.script_flush()),
            ("restart", lambda: server.restart()),
            ("sigstop", stop_a_holder),
        ]  # fmt: skip
        for round_ in range(ROUNDS):
            for what, fault in faults:
                fault()
                busy_again(f"{what} #{round_ + 1}")
        last_fault = server_now(admin)
        # Whatever a frozen worker held or was handed runs out: its leases
        # (ttl), grants pushed while it looked alive (liveness, pick-up).
        settled = last_fault + max(TTL, ALIVE + PICKUP) + 1.0
        wait_until(lambda: server_now(admin) > settled, timeout=30, what="settled")
    finally:
        stop.value = 1
        for worker in workers:
            if worker.process.is_alive():
                os.kill(worker.pid, signal.SIGCONT)
            worker.process.join(60)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(10)
    for worker in workers:
        assert worker.process.exitcode == 0, (
            f"worker {worker.pid} ended with {worker.process.exitcode} (see its traceback above)"
        )

    # A dead waiter deep in the queue (never at its head) is first found
    # absent by a gc, which starts its presence grace; the next gc after
    # the grace drops it.
    pool.gc()
    graced = server_now(admin) + GRACE
    wait_until(lambda: server_now(admin) > graced, timeout=10, what="the presence grace")
    pool.gc()
    status = pool.status()
    grants, errors = collect(workers)
    summary = {
        "faults": done,
        "grants": len(grants),
        "lost_at_release": sum(1 for g in grants if g.released is False),
        "transport errors that reached a worker": len(errors),
    }
    print(f"\n[faults] {json.dumps(summary)}")

    assert len(done) == ROUNDS * 6
    problems = over_capacity(grants)
    assert not problems, f"over capacity: {problems[:3]}"
    for resource in RESOURCES:
        mine = sorted((g for g in grants if g.resource == resource), key=lambda g: g.granted_at)
        tokens = [g.token for g in mine]
        assert len(set(tokens)) == len(tokens), f"{resource}: a token was granted twice"
        for before, after in itertools.pairwise(mine):
            if after.granted_at > before.granted_at:
                assert after.token > before.token, (resource, before.token, after.token)
    # The pool is whole again.
    assert (status.size, status.free, status.leased, status.waiting) == (3, 3, 0, 0), status
    for row in status.resources:
        assert row.leases == 0 and row.state == "free", row
    admin.close()
