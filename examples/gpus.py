"""Two-card jobs and one-card jobs share a pool of GPUs, in arrival order.

    python examples/gpus.py                                  # in-process fakeredis
    python examples/gpus.py --url redis://localhost:6379/0   # a real server

Jobs arrive one after another; each needs one or two cards. A two-card job
asks with ``lease_many(2)``: it gets both cards in one step or waits, and
while it waits at the head of the line, the one-card jobs behind it wait
too, even if a card is free. That is what keeps it from being starved by a
stream of one-card jobs; and since nobody ever holds one card while waiting
for a second, two two-card jobs can never block each other.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
import uuid

import redis

from allocator import FairAllocator, Lease


def connect(url: str | None) -> redis.Redis:
    """A client for ``url``, or an in-process fakeredis server when there is none."""
    if url:
        return redis.Redis.from_url(url)
    try:
        import fakeredis
    except ImportError:
        sys.exit("this example needs fakeredis (pip install 'fakeredis[lua]') or --url redis://...")
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


class Job:
    def __init__(self, number: int, cards: int, seconds: float) -> None:
        self.number, self.cards, self.seconds = number, cards, seconds
        self.leases: list[Lease] = []
        self.ran: tuple[float, float] = (0.0, 0.0)
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self, pool: FairAllocator) -> None:
        try:
            with pool.lease_many(self.cards, timeout=60) as leases:
                self.leases = leases
                start = time.monotonic()
                time.sleep(self.seconds)  # the training step
                self.ran = (start, time.monotonic())
        except BaseException as exc:  # re-raised by main
            self.error = exc
        finally:
            self.done.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="Redis URL (default: an in-process fakeredis)")
    parser.add_argument("--gpus", type=int, default=4, help="cards in the pool (4)")
    parser.add_argument("--jobs", type=int, default=12, help="jobs to run (12)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the job mix (7)")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    pool = FairAllocator(connect(args.url), f"gpus-{uuid.uuid4().hex[:8]}", lease_ttl=30)
    cards = [f"gpu-{i}" for i in range(args.gpus)]
    pool.extend(cards)
    jobs = [Job(n + 1, rng.choice((1, 2)), rng.uniform(0.02, 0.08)) for n in range(args.jobs)]
    print(f"{args.gpus} GPUs; {args.jobs} jobs arrive in this order, cards needed:")
    print("  " + " ".join(str(job.cards) for job in jobs))

    # Start the jobs one at a time, each once the one before is in line
    # (waiting or served), so that the arrival order is the order above.
    started = time.monotonic()
    threads = []
    for i, job in enumerate(jobs):
        thread = threading.Thread(target=job.run, args=(pool,), daemon=True)
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            served = sum(1 for j in jobs[: i + 1] if j.leases or j.done.is_set())
            if served + pool.status().waiting >= i + 1:
                break
            time.sleep(0.001)
    for thread in threads:
        thread.join()
    for job in jobs:
        if job.error is not None:
            raise job.error

    for job in sorted(jobs, key=lambda j: j.leases[0].granted_at):
        names = " ".join(lease.resource for lease in job.leases)
        print(
            f"  job {job.number:2d} ({job.cards} card{'s' if job.cards > 1 else ' '})  "
            f"got {names:<11}  at +{(job.ran[0] - started) * 1000:6.1f} ms"
        )

    # Arrival order = ticket order; grants must follow it (grants made in
    # one script run share a server time).
    by_arrival = sorted(jobs, key=lambda j: ticket_key(j.leases[0].ticket))
    granted = [j.leases[0].granted_at for j in by_arrival]
    in_order = granted == sorted(granted)
    whole = all(len({lease.resource for lease in j.leases}) == j.cards for j in jobs)
    shared = overlaps(jobs)
    status = pool.status()
    print(f"served in arrival order: {'yes' if in_order else 'NO'}")
    print(f"every job got all its cards at once: {'yes' if whole else 'NO'}")
    print(f"a card used by two jobs at once: {shared} times")
    print(
        f"status: {status.size} resources, {status.free} free, {status.leased} leased, "
        f"{status.waiting} waiting"
    )
    return 0 if in_order and whole and not shared else 1


def ticket_key(ticket: str) -> tuple[int, int]:
    ms, _, seq = ticket.partition("-")
    return int(ms), int(seq)


def overlaps(jobs: list[Job]) -> int:
    """Pairs of jobs that ran on one card at the same time."""
    count = 0
    for a in jobs:
        for b in jobs:
            common = {x.resource for x in a.leases} & {x.resource for x in b.leases}
            at_once = a.ran[0] < b.ran[1] and b.ran[0] < a.ran[1]
            if a.number < b.number and common and at_once:
                count += 1
    return count


if __name__ == "__main__":
    sys.exit(main())
