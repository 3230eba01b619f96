"""A periodic gc job for a pool: reclaim leases of dead holders, drop dead waiters.

    python examples/gc_job.py --url redis://localhost:6379/0 --pool proxies --every 5

While anyone waits, the waiters themselves reclaim expired leases; a gc job
covers the quiet times (a holder that died while nobody was waiting keeps its
resource out of ``status().free`` until something runs), drops tickets of dead
waiters anywhere in the queue, and expires stale soft bindings. Any number of
these jobs may run at once. Each run prints its ``GCReport``.

SIGTERM or SIGINT (Ctrl-C) stop the job cleanly: a run in progress finishes,
then the job exits with status 0. Like ``allocator gc --every``, the job
outlives a lost connection or a server restart: a failed run is reported on
stderr in one line and the next run comes at its time. A refused password or
ACL is no passing trouble: one line on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from types import FrameType

import redis

from allocator import FairAllocator


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="Redis URL, e.g. redis://localhost:6379/0")
    parser.add_argument("--pool", required=True, help="the pool's name")
    parser.add_argument("--prefix", default="alloc", help="the pool's key prefix (default: alloc)")
    parser.add_argument(
        "--every", type=positive, default=5.0, help="seconds between two runs (default: 5)"
    )
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Only note it: the run in progress finishes, the loop then ends.
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    client = redis.Redis.from_url(args.url)
    pool = FairAllocator(client, args.pool, prefix=args.prefix)
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                report = pool.gc()
            except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
                print(f"gc job: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                return 1
            except redis.RedisError as exc:
                # Redis down, restarting, failing over: try again next time.
                print(
                    f"gc job: run failed, {type(exc).__name__}: {exc}", file=sys.stderr, flush=True
                )
            else:
                took = time.monotonic() - started
                print(
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pool={args.pool!r} {report} "
                    f"took={took * 1000:.1f}ms",
                    flush=True,
                )
            stop.wait(args.every)
    finally:
        client.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("gc job stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
