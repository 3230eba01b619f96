"""Soft binding: each worker keeps getting the GPU that already holds its model.

    python examples/worker_affinity.py                                  # in-process fakeredis
    python examples/worker_affinity.py --url redis://localhost:6379/0   # a real server

Workers "w0", "w1", ... lease a GPU for each job. A GPU keeps the model of the
last worker that ran on it, so a job that lands on another worker's GPU must
load its model first (a "cold load"). The same workload runs twice, on two
fresh pools: once with plain ``pool.lease()``, where the pool hands out the
GPU that has been free longest, and once with ``pool.lease(bind=name)``, where
a worker gets the GPU it last used whenever that one is free. Binding is soft:
it never lets a worker pass another in the queue, it only picks among the free
GPUs.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections import Counter

import redis

from allocator import FairAllocator


def connect(url: str | None) -> redis.Redis:
    """A client for ``url``, or an in-process fakeredis server when there is none."""
    if url:
        return redis.Redis.from_url(url)
    try:
        import fakeredis
    except ImportError:
        sys.exit("this example needs fakeredis (pip install 'fakeredis[lua]') or --url redis://...")
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


class Cluster:
    """Which model each GPU holds, and what the jobs cost."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded: dict[str, str] = {}  # GPU -> worker whose model it holds
        self.cold_loads = 0
        self.got: dict[str, list[str]] = {}  # worker -> the GPU of each of its jobs
        self.errors: list[BaseException] = []

    def run_job(self, worker: str, gpu: str) -> None:
        with self.lock:
            self.got.setdefault(worker, []).append(gpu)
            if self.loaded.get(gpu) != worker:
                self.cold_loads += 1
                self.loaded[gpu] = worker
        time.sleep(0.002)  # the job


def worker(
    pool: FairAllocator,
    name: str,
    jobs: int,
    bind: bool,
    cluster: Cluster,
    go: threading.Barrier,
) -> None:
    try:
        go.wait()
        for _ in range(jobs):
            with pool.lease(timeout=30, bind=name if bind else None) as lease:
                cluster.run_job(name, lease.resource)
    except Exception as exc:  # re-raised by main: a thread has nobody to raise to
        with cluster.lock:
            cluster.errors.append(exc)


def run(client: redis.Redis, args: argparse.Namespace, bind: bool) -> tuple[Cluster, FairAllocator]:
    pool = FairAllocator(client, f"gpus-{uuid.uuid4().hex[:8]}", lease_ttl=30)
    pool.extend([f"gpu-{i}" for i in range(args.gpus)])
    cluster = Cluster()
    names = [f"w{i}" for i in range(args.workers)]
    go = threading.Barrier(len(names))
    threads = [
        threading.Thread(target=worker, args=(pool, n, args.jobs, bind, cluster, go), daemon=True)
        for n in names
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if cluster.errors:
        raise cluster.errors[0]
    return cluster, pool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="Redis URL (default: an in-process fakeredis)")
    parser.add_argument("--workers", type=int, default=4, help="workers (4)")
    parser.add_argument("--gpus", type=int, default=4, help="GPUs in the pool (4)")
    parser.add_argument("--jobs", type=int, default=20, help="jobs per worker (20)")
    args = parser.parse_args(argv)
    client = connect(args.url)
    total = args.workers * args.jobs
    print(f"{args.workers} workers run {args.jobs} jobs each on {args.gpus} GPUs")

    plain, _ = run(client, args, bind=False)
    print(f"without bind: {plain.cold_loads:3d} cold loads in {total} jobs")

    bound, pool = run(client, args, bind=True)
    print(f"with bind:    {bound.cold_loads:3d} cold loads in {total} jobs")
    for name, gpus in sorted(bound.got.items()):
        counts = Counter(gpus).most_common()
        print(f"  {name} ran on " + ", ".join(f"{gpu} x{n}" for gpu, n in counts))

    # A hit is a job that got the GPU its worker was bound to; a worker's
    # first job has no binding yet, and binds it to whatever it got.
    hits = misses = 0
    for gpus in bound.got.values():
        home = gpus[0]
        hits += sum(1 for g in gpus[1:] if g == home)
        misses += sum(1 for g in gpus[1:] if g != home)
    ratio = hits / (hits + misses) if hits + misses else 0.0
    print(f"binding hit ratio, counted here: {ratio:.2f} ({hits} hits, {misses} misses)")
    status = pool.status()
    seen = status.bind_hits + status.bind_misses
    pool_ratio = status.bind_hits / seen if seen else 0.0
    print(
        f"binding hit ratio, pool.status(): {pool_ratio:.2f} "
        f"({status.bind_hits} hits, {status.bind_misses} misses, {status.bindings} bindings)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
