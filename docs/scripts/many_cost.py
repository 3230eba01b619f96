"""The cost of a grant of 1, 2 and 8 resources (docs/performance.md).

    python docs/scripts/many_cost.py            # a private redis-server from PATH
    python docs/scripts/many_cost.py --n 2000

For each count, ``--n`` uncontended cycles of ``acquire_many(count)`` and a
``release`` of every lease, on a pool of 16 resources, one client. The
server's own time per script call is read from its SLOWLOG (threshold 0:
every command is logged with its execution time in microseconds, no network
and no client in it; a Functions library on Redis >= 7, scripts on 6.2, as
the library chooses); the client's time is the wall time of the whole
cycle. ``acquire`` (the single-resource script) is measured the same way as
the baseline. Prints p50 (and p90) of each.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import redis

from allocator import FairAllocator
from allocator._scripts import scripts
from allocator._server import RedisServer


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(client: Any, count: int | None, n: int) -> dict[str, Any]:
    pool = FairAllocator(client, f"cost-{uuid.uuid4().hex[:8]}")
    pool.extend([f"r{i:02d}" for i in range(16)])
    # Scripts are called by SHA (EVALSHA), functions by name (FCALL).
    names = {sha: op for op, sha in scripts().sha.items()}
    names |= {f"{op}_{scripts().version}": op for op in scripts().sha}
    for _ in range(50):  # warm up: scripts loaded, keys made
        leases = [pool.acquire()] if count is None else pool.acquire_many(count)
        for lease in leases:
            pool.release(lease)
    client.slowlog_reset()
    cycles = []
    for _ in range(n):
        began = time.perf_counter()
        leases = [pool.acquire()] if count is None else pool.acquire_many(count)
        for lease in leases:
            pool.release(lease)
        cycles.append((time.perf_counter() - began) * 1e6)
    per_op: dict[str, list[float]] = {}
    for entry in client.slowlog_get(1_000_000):
        command = entry["command"]
        if isinstance(command, bytes):
            command = command.decode()
        words = command.split()
        if words and words[0].upper() in ("EVALSHA", "FCALL") and words[1] in names:
            per_op.setdefault(names[words[1]], []).append(float(entry["duration"]))
    grant = per_op["acquire" if count is None else "acquire_many"]
    release = per_op["release"]
    return {
        "count": count or 1,
        "script": "acquire" if count is None else "acquire_many",
        "grant_p50_us": pct(grant, 0.5),
        "grant_p90_us": pct(grant, 0.9),
        "release_p50_us": pct(release, 0.5),
        "cycle_p50_us": statistics.median(cycles),
        "calls": len(grant),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="cycles per count (2000)")
    args = parser.parse_args(argv)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        version = client.info("server")["redis_version"]
        print(f"redis-server {version}, {args.n} cycles each, pool of 16, p50 (p90) in µs")
        print("script         count  server/grant    server/release  client/cycle")
        for count in (None, 1, 2, 8):
            r = measure(client, count, args.n)
            grant = f"{r['grant_p50_us']:6.0f} ({r['grant_p90_us']:4.0f})"
            print(
                f"{r['script']:<13}  {r['count']:>5}  {grant}"
                f"   {r['release_p50_us']:6.0f}           {r['cycle_p50_us']:7.0f}"
            )
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
