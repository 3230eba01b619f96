"""The longest server stall of status(), leases() and gc() on a large pool
(docs/performance.md: one status run over 50,000 resources used to block
the server for 378 ms, before the reads went a page per script run).

    python docs/scripts/status_stall.py                    # 50,000 and 500,000
    python docs/scripts/status_stall.py --sizes 10000

For each size, a private redis-server from PATH gets a pool of that many
resources, a tenth of them leased, and a SLOWLOG threshold of 0 (every
command is logged with its own execution time in microseconds, no network
and no client in it). Then status(), leases() and gc() run once each and
the longest single script run of each is printed, with how many runs it
took and the whole call's wall time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import redis

from allocator import FairAllocator
from allocator._server import RedisServer

SCRIPT_VERBS = {b"FCALL", b"FCALL_RO", b"EVALSHA", b"EVALSHA_RO", b"EVAL", b"EVAL_RO"}


def runs(client: Any) -> list[int]:
    """Durations (us) of the script runs the SLOWLOG holds, then empties it."""
    entries = client.slowlog_get(100_000)
    client.slowlog_reset()
    return [
        int(e["duration"])
        for e in entries
        if bytes(e["command"]).split(b" ", 1)[0].upper() in SCRIPT_VERBS
    ]


def measure(size: int) -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        pool = FairAllocator(client, "stall")
        for start in range(0, size, 10_000):
            pool.extend([f"res-{i:07d}" for i in range(start, min(size, start + 10_000))])
        for _ in range(size // 10):
            pool.acquire(blocking=False, ttl=3600)
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        for name, call in (("status", pool.status), ("leases", pool.leases), ("gc", pool.gc)):
            t0 = time.monotonic()
            call()
            wall = time.monotonic() - t0
            durations = runs(client)
            print(
                f"{size:>9,} resources  {name:<7} longest run {max(durations) / 1000:7.2f} ms "
                f"in {len(durations):5,} runs; whole call {wall:6.2f} s"
            )
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 500_000])
    for size in parser.parse_args().sizes:
        measure(size)


if __name__ == "__main__":
    main()
