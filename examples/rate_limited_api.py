"""Many clients share one API key's budget of N calls per second.

    python examples/rate_limited_api.py                                  # in-process fakeredis
    python examples/rate_limited_api.py --url redis://localhost:6379/0   # a real server

The key is one resource with ``capacity=N`` (N calls in flight at once) and
``rate=(N, 1.0)`` (at most N grants in any 1 s window). Clients simply lease it
for each call; the pool queues them in arrival order and hands out the budget
as it frees up, waking the next waiter when it does, without polling. The
example then checks the grant times (``Lease.granted_at``, the server's
clock) against the budget: no 1 s window, wherever it starts, may hold more
than N calls.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
import uuid
from collections.abc import Sequence

import redis

from allocator import FairAllocator

KEY = "api-key"


def connect(url: str | None) -> redis.Redis:
    """A client for ``url``, or an in-process fakeredis server when there is none."""
    if url:
        return redis.Redis.from_url(url)
    try:
        import fakeredis
    except ImportError:
        sys.exit("this example needs fakeredis (pip install 'fakeredis[lua]') or --url redis://...")
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


def micros(seconds: float) -> int:
    # Whole microseconds (the resolution of the server's TIME) keep window
    # edges exact: no float rounding decides whether a call is in or out.
    return round(seconds * 1_000_000)


def busiest_window(times: Sequence[float], window: float) -> int:
    """The most calls in any half-open window ``[t, t + window)``.

    The busiest window can always be moved right until it starts at a call, so
    it is enough to try the windows that start at each call.
    """
    stamps = sorted(micros(t) for t in times)
    width = micros(window)
    best, end = 0, 0
    for start, stamp in enumerate(stamps):
        end = max(end, start)
        while end < len(stamps) and stamps[end] < stamp + width:
            end += 1
        best = max(best, end - start)
    return best


def per_window(times: Sequence[float], window: float) -> list[int]:
    """Calls in consecutive windows ``[t0 + k*window, t0 + (k+1)*window)``, t0 the first call."""
    stamps = sorted(micros(t) for t in times)
    counts: list[int] = []
    for stamp in stamps:
        k = (stamp - stamps[0]) // micros(window)
        counts.extend([0] * (k + 1 - len(counts)))
        counts[k] += 1
    return counts


def client(
    pool: FairAllocator,
    calls: queue.Queue[int],
    granted: list[float],
    errors: list[BaseException],
    go: threading.Barrier,
) -> None:
    try:
        go.wait()
        while True:
            try:
                calls.get_nowait()
            except queue.Empty:
                return
            with pool.lease(timeout=30) as lease:
                granted.append(lease.granted_at)  # list.append is atomic
                time.sleep(0.005)  # the API call
    except Exception as exc:  # re-raised by main: a thread has nobody to raise to
        errors.append(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="Redis URL (default: an in-process fakeredis)")
    parser.add_argument("--budget", type=int, default=10, help="calls per window (10)")
    parser.add_argument("--window", type=float, default=1.0, help="window in seconds (1.0)")
    parser.add_argument("--clients", type=int, default=8, help="client threads (8)")
    parser.add_argument("--calls", type=int, default=30, help="calls to make in all (30)")
    args = parser.parse_args(argv)

    pool = FairAllocator(connect(args.url), f"api-{uuid.uuid4().hex[:8]}", lease_ttl=30)
    pool.extend([KEY], capacity=args.budget, rate=(args.budget, args.window))
    print(
        f"budget: {args.budget} calls per {args.window:g} s on {KEY!r} "
        f"(capacity={args.budget}, rate=({args.budget}, {args.window:g}))"
    )

    calls: queue.Queue[int] = queue.Queue()
    for n in range(args.calls):
        calls.put(n)
    granted: list[float] = []
    errors: list[BaseException] = []
    go = threading.Barrier(args.clients)
    threads = [
        threading.Thread(target=client, args=(pool, calls, granted, errors, go), daemon=True)
        for _ in range(args.clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]

    span = max(granted) - min(granted)
    print(f"{len(granted)} calls by {args.clients} clients, first to last grant {span:.2f} s")
    for k, count in enumerate(per_window(granted, args.window)):
        start = k * args.window
        print(f"  window +{start:.1f} s .. +{start + args.window:.1f} s: {count:3d} calls")

    # The achieved rate over whole windows from the first grant: the budget
    # allows at most budget * windows calls in them, so it can't pass budget.
    windows = max(1, int(micros(span) // micros(args.window)))
    in_windows = sum(per_window(granted, args.window)[:windows])
    rate = in_windows / (windows * args.window)
    budget_rate = args.budget / args.window
    busiest = busiest_window(granted, args.window)
    ok = busiest <= args.budget and rate <= budget_rate
    print(
        f"achieved rate: {rate:.1f} calls/s over {windows} whole window(s) "
        f"(budget {budget_rate:g} calls/s)"
    )
    print(
        f"busiest {args.window:g} s sliding window: {busiest} calls "
        f"(budget {args.budget}) {'OK' if ok else 'OVER BUDGET'}"
    )
    return 0 if ok and len(granted) == args.calls else 1


if __name__ == "__main__":
    sys.exit(main())
