"""Worker processes for tests/test_processes.py (importable by 'spawn')."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

from allocator import FairAllocator


def server_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def ordered_waiter(url: str, pool: str, me: int, start: Any, results: Any) -> None:
    """Wait for `start`, then acquire once and report (me, ticket, token)."""
    client = redis.Redis.from_url(url)
    alloc = FairAllocator(client, pool)
    start.wait()
    lease = alloc.acquire(timeout=60)
    results.put((me, lease.ticket, lease.token))
    alloc.release(lease)


def hammer(
    url: str, pool: str, me: int, rounds: int, long_every: int, ledger: str, barrier: Any
) -> None:
    """Acquire and release `rounds` times; write every visit to the ledger.

    Inside each lease: INCR a per-resource counter (outside the pool's keys),
    note server times on entry and exit, DECR. The ledger lines are written
    and fsync'ed before release, so the test reads what really happened.
    """
    client = redis.Redis.from_url(url)
    alloc = FairAllocator(client, pool)
    barrier.wait()
    with open(ledger, "a", encoding="utf-8") as out:
        for i in range(rounds):
            lease = alloc.acquire(timeout=120)
            inside = client.incr(f"{pool}:inside:{lease.resource}")
            entered = server_now(client)
            # Most holds are short; some outlast every internal timer of the
            # library (heartbeat 1 s, pick-up window 2 s).
            time.sleep(2.2 if long_every and i % long_every == long_every - 1 else 0.002)
            left = server_now(client)
            client.decr(f"{pool}:inside:{lease.resource}")
            line = {
                "who": me, "resource": lease.resource, "token": lease.token,
                "ticket": lease.ticket, "entered": entered, "left": left,
                "inside": inside, "expires_at": lease.expires_at,
            }  # fmt: skip
            out.write(json.dumps(line) + "\n")
            out.flush()
            os.fsync(out.fileno())
            assert alloc.release(lease), "lease lost while held"


def rate_client(url: str, pool: str, until: float, barrier: Any, results: Any) -> None:
    """Lease the rate-limited key as often as the pool allows until server
    time `until`; report each grant's server time."""
    client = redis.Redis.from_url(url)
    alloc = FairAllocator(client, pool)
    barrier.wait()
    granted = []
    while True:
        lease = alloc.acquire(timeout=30)
        granted.append(lease.granted_at)
        alloc.release(lease)
        if lease.granted_at >= until:
            break
    results.put(granted)
