"""``allocator demo``: watch a handful of threads share a small pool in FIFO order.

Each worker thread waits at a barrier, then leases a resource ``--rounds``
times, holding it for a moment each time. Every grant is printed as it happens;
the summary then checks, from the leases alone, what the library promises:

- FIFO: arrival order is the order of the tickets (Stream ids, compared as
  ``(ms, seq)``); grant order is ``(granted_at, ticket)``, both on the server's
  clock. A grant that comes before the grant of someone who arrived earlier
  (and so was still waiting) is a violation; there must be none.
- fencing: per resource, tokens increase strictly in grant order.
- safety: no resource was ever seen held by more than its capacity.
- no loss: afterwards the pool has nothing leased and nobody waiting.

By default the pool lives in an in-process fakeredis server, so the demo needs
no Redis; ``--url`` uses a real one and ``--server`` starts a private
``redis-server`` for the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import attrs

from ._common import non_empty, positive_int

if TYPE_CHECKING:
    from allocator import FairAllocator
    from allocator._values import Lease, PoolStatus

__all__ = ["add_arguments", "check", "fifo_violations", "register", "run", "ticket_key"]


def register(commands: Any) -> None:
    """The ``demo`` subcommand."""
    demo = commands.add_parser(
        "demo", help="watch workers share a small pool in arrival order (no server needed)"
    )
    add_arguments(demo)
    demo.set_defaults(run=run)


FAKEREDIS_HINT = (
    "the demo runs on an in-process fakeredis by default, but fakeredis is not installed;\n"
    "install it with:  pip install 'fakeredis[lua]'\n"
    "or run against a server:  allocator demo --url redis://localhost:6379/0"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser`` (the ``demo`` subcommand's)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        type=non_empty,
        help="Redis URL to run against (default: $REDIS_URL if set, else an in-process "
        "fakeredis: no server needed)",
    )
    where.add_argument(
        "--server",
        action="store_true",
        help="start a private redis-server for the run (needs redis-server on PATH)",
    )
    parser.add_argument("--workers", type=positive_int, default=6, help="worker threads (6)")
    parser.add_argument("--resources", type=positive_int, default=2, help="pool size (2)")
    parser.add_argument(
        "--capacity", type=positive_int, default=1, help="leases per resource at once (1)"
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="leases per worker (3)")
    parser.add_argument(
        "--hold",
        type=_non_negative_float,
        default=0.01,
        help="seconds a worker keeps its resource (0.01); the demo's checks do not depend on it",
    )
    parser.add_argument(
        "--timeout", type=_non_negative_float, default=30.0, help="acquire timeout in seconds (30)"
    )
    parser.add_argument(
        "--pool",
        type=non_empty,
        default=None,
        help="pool name (default: a fresh demo-<random> pool, deleted after the run)",
    )
    parser.add_argument("--quiet", action="store_true", help="print the summary only")


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 if every check held, 1 if one failed or the demo could
    not run (no server, a refused login, no redis-server for ``--server``:
    one line on stderr, as every command says it)."""
    import redis

    from ._common import CommandError, describe, safe_url, url_of

    try:
        return _start(args, sys.stdout)
    except CommandError as exc:
        print(f"allocator: {exc}", file=sys.stderr)
    except redis.RedisError as exc:
        print(f"allocator: {describe(exc, safe_url(url_of(args)))}", file=sys.stderr)
    return 1


def _start(args: argparse.Namespace, out: TextIO) -> int:
    from ._common import CommandError

    if args.server:
        from allocator._server import RedisServer, find_redis_server

        if find_redis_server() is None:
            raise CommandError("demo --server needs redis-server on PATH")
        with RedisServer() as server:
            return _run_on(
                _real_client(server.url), f"private redis-server {server.url}", args, out
            )
    url = args.url or os.environ.get("REDIS_URL")
    if url:
        from ._common import connect

        # As the other commands connect: a Redis Cluster is detected by itself.
        conn = connect(argparse.Namespace(url=url, prefix=None))
        where = f"Redis Cluster at {conn.shown}" if conn.cluster else conn.shown
        return _run_on(conn.client, where, args, out)
    client = _fake_client()
    if client is None:
        raise CommandError(f"demo: {FAKEREDIS_HINT}")
    return _run_on(client, "in-process fakeredis", args, out)


# -- the checks, pure functions of the leases ---------------------------------------------


def ticket_key(ticket: str) -> tuple[int, int]:
    """A Stream id ``"ms-seq"`` as a tuple that sorts in arrival order."""
    ms, _, seq = ticket.partition("-")
    return int(ms), int(seq or 0)


def _grant_key(lease: Lease) -> tuple[float, tuple[int, int]]:
    # Grants in one script run share a server time; the script serves them in
    # ticket order, so the ticket breaks the tie.
    return lease.granted_at, ticket_key(lease.ticket)


def fifo_violations(leases: Iterable[Lease]) -> int:
    """How many grants passed a requester who had arrived earlier.

    In grant order, a grant is a violation if some later grant has an earlier
    ticket: that requester was already queued (it arrived first) and not yet
    served (it was granted later), and was passed.
    """
    in_grant_order = sorted(leases, key=_grant_key)
    violations = 0
    earliest_later: tuple[int, int] | None = None
    for lease in reversed(in_grant_order):
        key = ticket_key(lease.ticket)
        if earliest_later is not None and earliest_later < key:
            violations += 1
        if earliest_later is None or key < earliest_later:
            earliest_later = key
    return violations


def fencing_violations(leases: Iterable[Lease]) -> int:
    """How many grants carried a token not above the previous one of their resource."""
    last: dict[str, int] = {}
    violations = 0
    for lease in sorted(leases, key=_grant_key):
        if lease.resource in last and lease.token <= last[lease.resource]:
            violations += 1
        last[lease.resource] = lease.token
    return violations


@attrs.frozen
class Report:
    """What :func:`check` found."""

    grants: int
    fifo_violations: int
    fencing_violations: int
    over_capacity: int


def check(leases: Sequence[Lease], max_holders: dict[str, int], capacity: int) -> Report:
    """Check the recorded leases; ``max_holders`` is the most holders seen per resource."""
    return Report(
        grants=len(leases),
        fifo_violations=fifo_violations(leases),
        fencing_violations=fencing_violations(leases),
        over_capacity=sum(1 for n in max_holders.values() if n > capacity),
    )


# -- the run ---------------------------------------------------------------------------


class _Recorder:
    """Collects grants from the worker threads and prints each as it happens."""

    def __init__(self, out: TextIO, quiet: bool, name_width: int, resource_width: int) -> None:
        self._lock = threading.Lock()
        self._out = out
        self._quiet = quiet
        self._widths = (name_width, resource_width)
        self.leases: list[Lease] = []
        self.waits: list[float] = []
        self.holders: dict[str, int] = {}
        self.max_holders: dict[str, int] = {}
        self.errors: list[tuple[str, BaseException]] = []

    def granted(self, worker: str, lease: Lease, waited: float) -> None:
        # Counted after the grant and uncounted before the release: if two
        # holders are ever counted at once, their leases really overlapped.
        with self._lock:
            self.leases.append(lease)
            self.waits.append(waited)
            held = self.holders.get(lease.resource, 0) + 1
            self.holders[lease.resource] = held
            self.max_holders[lease.resource] = max(held, self.max_holders.get(lease.resource, 0))
            if not self._quiet:
                nw, rw = self._widths
                print(
                    f"  {worker:<{nw}}  got {lease.resource:<{rw}}"
                    f"  waited {waited * 1000:7.1f} ms  token {lease.token}  ticket {lease.ticket}",
                    file=self._out,
                    flush=True,
                )

    def releasing(self, lease: Lease) -> None:
        with self._lock:
            self.holders[lease.resource] -= 1

    def failed(self, worker: str, exc: BaseException) -> None:
        with self._lock:
            self.errors.append((worker, exc))


def _worker(
    pool: FairAllocator,
    name: str,
    args: argparse.Namespace,
    start: threading.Barrier,
    rec: _Recorder,
) -> None:
    try:
        start.wait()
        for _ in range(args.rounds):
            asked = time.perf_counter()
            with pool.lease(timeout=args.timeout) as lease:
                rec.granted(name, lease, time.perf_counter() - asked)
                # The work: only there so that requesters queue up.
                time.sleep(args.hold)
                rec.releasing(lease)
    except Exception as exc:  # reported in the summary: a thread has nobody to raise to
        rec.failed(name, exc)


def _run_on(client: Any, backend: str, args: argparse.Namespace, out: TextIO) -> int:
    try:
        return _demo(client, backend, args, out)
    finally:
        client.close()


def _demo(client: Any, backend: str, args: argparse.Namespace, out: TextIO) -> int:
    from allocator import FairAllocator

    pool_name = f"demo-{uuid.uuid4().hex[:8]}" if args.pool is None else args.pool
    pool = FairAllocator(client, pool_name)
    resources = [f"res-{i + 1}" for i in range(args.resources)]
    workers = [f"w{i + 1}" for i in range(args.workers)]
    slots = "" if args.capacity == 1 else f" x{args.capacity}"
    print(
        f"allocator demo: {len(workers)} workers x {args.rounds} rounds share "
        f"{len(resources)} resources{slots} in pool {pool_name!r} ({backend})",
        file=out,
    )
    pool.extend(resources, capacity=args.capacity)
    rec = _Recorder(out, args.quiet, max(map(len, workers)), max(map(len, resources)))
    start = threading.Barrier(len(workers))
    threads = [
        threading.Thread(
            target=_worker, args=(pool, w, args, start, rec), name=f"demo-{w}", daemon=True
        )
        for w in workers
    ]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    status = pool.status()
    if args.pool is None:
        # A pool the demo named itself goes with every key it has, so that
        # runs leave nothing behind.
        pool.delete()
    else:
        pool.remove(resources)
    return _summarize(rec, status, args, elapsed, out)


def _summarize(
    rec: _Recorder, status: PoolStatus, args: argparse.Namespace, elapsed: float, out: TextIO
) -> int:
    report = check(rec.leases, rec.max_holders, args.capacity)
    expected = args.workers * args.rounds
    ok = not rec.errors and report.grants == expected

    def verdict(good: bool) -> str:
        return "OK" if good else "FAILED"

    print(f"\n{report.grants} grants in {elapsed:.2f} s", file=out)
    grants_of: dict[str, int] = {}
    for lease in rec.leases:
        grants_of[lease.resource] = grants_of.get(lease.resource, 0) + 1
    for resource, grants in sorted(grants_of.items()):
        print(
            f"  {resource:<10} {grants:3d} grants, at most {rec.max_holders[resource]} "
            f"holder(s) at once (capacity {args.capacity})",
            file=out,
        )
    if rec.waits:
        print(
            f"  {'waited':<10} median {statistics.median(rec.waits) * 1000:.1f} ms, "
            f"max {max(rec.waits) * 1000:.1f} ms",
            file=out,
        )
    checks = [
        (
            "FIFO",
            f"{report.fifo_violations} violations (grants in arrival order)",
            report.fifo_violations == 0,
        ),
        (
            "fencing",
            f"{report.fencing_violations} violations (tokens rise per resource)",
            report.fencing_violations == 0,
        ),
        ("safety", f"{report.over_capacity} resources over capacity", report.over_capacity == 0),
        (
            "no loss",
            f"leased {status.leased}, waiting {status.waiting}, "
            f"free {status.free} of {status.size}",
            status.leased == 0 and status.waiting == 0 and status.free == status.size,
        ),
    ]
    for label, text, good in checks:
        print(f"  {label:<10} {text:<48} {verdict(good)}", file=out)
        ok = ok and good
    for worker, exc in rec.errors:
        print(f"  {worker}: {type(exc).__name__}: {exc}", file=out)
    if report.grants != expected:
        print(f"  expected {expected} grants, got {report.grants}", file=out)
    print("all checks passed" if ok else "SOME CHECKS FAILED", file=out)
    return 0 if ok else 1


# -- clients and argument types -------------------------------------------------------------


def _real_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def _fake_client() -> Any:
    """An in-process fakeredis client with Lua, or None when that is not installed."""
    try:
        import fakeredis
    except ImportError:
        return None
    if importlib.util.find_spec("lupa") is None:  # fakeredis runs Lua through lupa
        return None
    return fakeredis.FakeRedis(server=fakeredis.FakeServer())


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, not {text}")
    return value
