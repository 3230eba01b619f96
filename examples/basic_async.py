"""Quick start, asyncio: five tasks share two proxies, served in arrival order.

    python examples/basic_async.py                                  # in-process fakeredis
    python examples/basic_async.py --url redis://localhost:6379/0   # a real server

``AsyncFairAllocator`` has every method of ``FairAllocator`` as a coroutine,
and ``lease()`` is an async context manager.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import redis.asyncio

from allocator import AsyncFairAllocator, Lease

PROXIES = ["http://10.0.0.1:3128", "http://10.0.0.2:3128"]


def connect(url: str | None) -> redis.asyncio.Redis:
    """An asyncio client for ``url``, or an in-process fakeredis server when there is none."""
    if url:
        return redis.asyncio.Redis.from_url(url)
    try:
        import fakeredis
    except ImportError:
        sys.exit("this example needs fakeredis (pip install 'fakeredis[lua]') or --url redis://...")
    return fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())


async def job(pool: AsyncFairAllocator, n: int) -> Lease:
    async with pool.lease(timeout=10) as lease:
        print(f"job {n}: got {lease.resource} (fencing token {lease.token})")
        await asyncio.sleep(0.05)  # the work
    return lease


def ticket_order(ticket: str) -> tuple[int, int]:
    """Stream ids ("ms-seq") sort by arrival as (ms, seq)."""
    ms, _, seq = ticket.partition("-")
    return int(ms), int(seq or 0)


async def amain(url: str | None, name: str) -> int:
    client = connect(url)
    try:
        pool = AsyncFairAllocator(client, name, lease_ttl=30)
        added = await pool.extend(PROXIES)
        print(f"pool {name!r}: {added} proxies added")

        leases = await asyncio.gather(*(job(pool, n) for n in range(5)))

        # Arrival order is the order of the queue tickets; grants must follow it.
        by_arrival = sorted(range(5), key=lambda n: ticket_order(leases[n].ticket))
        by_grant = sorted(
            range(5), key=lambda n: (leases[n].granted_at, ticket_order(leases[n].ticket))
        )
        print(f"arrival order: {' '.join(f'job {n}' for n in by_arrival)}")
        print(f"grant order:   {' '.join(f'job {n}' for n in by_grant)}")
        print(f"served in arrival order: {'yes' if by_arrival == by_grant else 'NO'}")

        status = await pool.status()
        print(
            f"status: {status.size} resources, {status.free} free, "
            f"{status.leased} leased, {status.waiting} waiting"
        )
        return 0 if by_arrival == by_grant else 1
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="Redis URL (default: an in-process fakeredis)")
    parser.add_argument("--pool", default="quickstart-async", help="pool name (quickstart-async)")
    args = parser.parse_args(argv)
    return asyncio.run(amain(args.url, args.pool))


if __name__ == "__main__":
    sys.exit(main())
