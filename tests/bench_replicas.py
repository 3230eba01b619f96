"""The cost of ``min_replicas=1`` on the uncontended cycle (docs/performance.md).

    .venv/bin/python tests/bench_replicas.py [--cycles 300] [--rounds 15]

Starts a primary and one replica on loopback (tests/_replication.py, the
``redis-server`` on PATH or ALLOCATOR_TEST_SERVER's build), and times
``acquire(blocking=False)`` + ``release`` on a pool of one resource, sync
client, with ``min_replicas=0`` and ``min_replicas=1`` interleaved round by
round (same processes, same server). Prints the median per cycle of each,
and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import _servers
from _replication import Replicated

from allocator import FairAllocator


def cycle_us(pool: FairAllocator, cycles: int) -> float:
    started = time.perf_counter()
    for _ in range(cycles):
        lease = pool.acquire(blocking=False)
        assert lease is not None
        pool.release(lease)
    return (time.perf_counter() - started) / cycles * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    _servers.use()
    name, number = _servers.version()
    with Replicated(replicas=1) as replicated:
        client = replicated.client()
        plain = FairAllocator(client, "bench-plain")
        confirmed = FairAllocator(client, "bench-confirmed", min_replicas=1, replica_timeout=1.0)
        for pool in (plain, confirmed):
            pool.extend(["r"])
            cycle_us(pool, 50)  # warm: scripts loaded, connections made
        times: dict[str, list[float]] = {"0": [], "1": []}
        for _ in range(options.rounds):
            times["0"].append(cycle_us(plain, options.cycles))
            times["1"].append(cycle_us(confirmed, options.cycles))
        base, with_wait = statistics.median(times["0"]), statistics.median(times["1"])
        print(f"server: {name} {'.'.join(map(str, number))}, one replica on loopback")
        print(f"uncontended acquire+release, min_replicas=0: {base:8.1f} us per cycle")
        print(f"uncontended acquire+release, min_replicas=1: {with_wait:8.1f} us per cycle")
        print(f"ratio: {with_wait / base:.2f}")
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
