"""Quick start: share a pool of proxies through Redis, first come, first served.

    python examples/basic.py                                  # in-process fakeredis
    python examples/basic.py --url redis://localhost:6379/0   # a real server

Every process that builds a ``FairAllocator`` with the same client settings,
prefix and name shares the same pool.
"""

from __future__ import annotations

import argparse
import sys

import redis

from allocator import AcquireTimeout, FairAllocator

PROXIES = ["http://10.0.0.1:3128", "http://10.0.0.2:3128"]


def connect(url: str | None) -> redis.Redis:
    """A client for ``url``, or an in-process fakeredis server when there is none."""
    if url:
        return redis.Redis.from_url(url)
    try:
        import fakeredis
    except ImportError:
        sys.exit("this example needs fakeredis (pip install 'fakeredis[lua]') or --url redis://...")
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="Redis URL (default: an in-process fakeredis)")
    parser.add_argument("--pool", default="quickstart", help="pool name (quickstart)")
    args = parser.parse_args(argv)

    pool = FairAllocator(connect(args.url), args.pool, lease_ttl=30)
    added = pool.extend(PROXIES)  # idempotent: run it at every start
    print(f"pool {args.pool!r}: {added} proxies added")

    # The usual way: a lease that is released when the block ends. Pass the
    # fencing token along to whatever the resource guards, so that a holder
    # whose lease ran out can be told apart from the current one.
    with pool.lease(timeout=10) as lease:
        print(f"leased {lease.resource} (fencing token {lease.token})")

    # By hand: acquire, renew, release.
    first = pool.acquire(timeout=10)
    second = pool.acquire(timeout=10)
    print(f"holding {first.resource} and {second.resource}")
    print(f"non-blocking acquire while both are held: {pool.acquire(blocking=False)}")
    try:
        pool.acquire(timeout=0.2)
    except AcquireTimeout as exc:
        print(f"blocking acquire with timeout=0.2: AcquireTimeout: {exc}")
    renewed = pool.renew(first, ttl=60)
    moved = renewed.expires_at - first.expires_at
    print(f"renewed {first.resource} for 60 s: deadline moved {moved:+.1f} s")
    first = renewed
    print(f"released: {pool.release(first)}, {pool.release(second)}")
    print(f"released again: {pool.release(first)}")

    status = pool.status()
    print(
        f"status: {status.size} resources, {status.free} free, "
        f"{status.leased} leased, {status.waiting} waiting"
    )
    for row in status.resources:
        print(f"  {row.name}: {row.state}, {row.leases} of {row.capacity} leased")
    return 0


if __name__ == "__main__":
    sys.exit(main())
