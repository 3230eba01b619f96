"""Pool features across OS processes, against a real Redis."""

from __future__ import annotations

import bisect

import redis
from _workers import CTX, rate_client, server_now

from allocator import FairAllocator


def test_rate_budget_holds_across_processes_and_waiters_are_woken_by_hints(
    redis_url: str, pool_name: str
) -> None:
    """One API key, budget 5 calls per 0.5 s, five processes asking as fast as
    they can for ~3 s. Never more than 5 grants in any 0.5 s window (server
    times); the throttled waiters are woken by the hint pushed for the time
    the budget frees, not by polling: few script calls per grant."""
    count, window, procs_n = 5, 0.5, 5
    client = redis.Redis.from_url(redis_url)
    pool = FairAllocator(client, pool_name)
    pool.extend(["api-key"], capacity=count, rate=(count, window))
    client.config_resetstat()
    until = server_now(client) + 3.0
    barrier, results = CTX.Barrier(procs_n), CTX.Queue()
    procs = [
        CTX.Process(target=rate_client, args=(redis_url, pool_name, until, barrier, results))
        for _ in range(procs_n)
    ]
    for p in procs:
        p.start()
    grants = sorted(g for _ in procs for g in results.get(timeout=120))
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    # The budget, from the grant times: no window of `window` seconds holds
    # more than `count` grants.
    for i, start in enumerate(grants):
        inside = bisect.bisect_left(grants, start + window) - i
        assert inside <= count, (start, grants[i : i + count + 2])
    # Each grant takes a slot of a window: n grants use (span + window) of
    # budget time; at full use that is count / window per second.
    span = grants[-1] - grants[0]
    achieved, budget = len(grants) / (span + window), count / window
    print(f"\nrate: {len(grants)} grants, {achieved:.2f}/s achieved, budget {budget:.1f}/s")
    stats = client.info("commandstats")
    calls = sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "fcall"))
    # acquire + release per grant, a hint-driven poll per throttled wake-up,
    # and one heartbeat per process and second: polling would be far more.
    print(f"script calls: {calls} for {len(grants)} grants")
    assert calls <= 4 * len(grants) + 2 * procs_n * (span + 2), (calls, len(grants))
    status = pool.status()
    assert (status.leased, status.waiting) == (0, 0)
    client.close()
