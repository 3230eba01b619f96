"""Where the grants that ``allocator bench`` sees out of arrival order
(figure 3d: a process that called ``acquire`` later got its grant more than
1 ms sooner) lose their time (docs/performance.md, "FIFO as the clients see
it"): before the server queued them, or after.

    python docs/scripts/late_grants.py                       # the quick throughput run
    python docs/scripts/late_grants.py --only handoff,throughput
    PYTHONPATH=/path/to/other/checkout python docs/scripts/late_grants.py

Runs the bench's own scenarios (quick mode) on a private redis-server. For
the measurement only, the workers (forked from this process) note, for
each ``acquire``, when it was called and when its script call was handed
to the socket (a wrapper around redis-py's ``send_packed_command``), in a
file per process. Each late grant g is paired with the grant h that passed
it by the most. Its ticket (a stream id: the server's order of arrival)
tells which: h's ticket before g's means the server received h's request
first, though h's process called ``acquire`` later (lost before the server
queued them); else the server granted them in their order and g's process
saw its grant late.
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import sys
import tempfile
import time
from typing import Any

from redis.connection import Connection

import allocator
from allocator._server import RedisServer
from allocator.cli.bench import make_plan
from allocator.cli.bench.base import ORDER_TIGHT_NS
from allocator.cli.bench.scenarios import Bench
from allocator.cli.bench.stats import percentile

#: This process's acquire under way: when it was called, when its script
#: call went to the socket.
_CURRENT: dict[str, int] = {}


def _noted_send(send: Any) -> Any:
    def noted(self: Any, command: Any, check_health: bool = True) -> Any:
        if "called" in _CURRENT and "sent" not in _CURRENT:
            first = command[0] if isinstance(command, list) else command
            if b"acquire" in bytes(first[:200]):
                _CURRENT["sent"] = time.monotonic_ns()
        return send(self, command, check_health)

    return noted


def _noted_acquire(acquire: Any, folder: str) -> Any:
    def noted(self: Any, *args: Any, **kwargs: Any) -> Any:
        _CURRENT.clear()
        _CURRENT["called"] = time.monotonic_ns()
        lease = acquire(self, *args, **kwargs)
        lead = _CURRENT.get("sent", 0) - _CURRENT["called"]
        with open(f"{folder}/{os.getpid()}", "a", encoding="utf-8") as out:
            out.write(f"{lease.ticket} {lead}\n")
        return lease

    return noted


class _Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _ticket(text: str) -> tuple[int, int]:
    ms, seq = text.split("-")
    return int(ms), int(seq)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", default="throughput", help="bench scenarios (default: throughput)"
    )
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="late-grants-")
    Connection.send_packed_command = _noted_send(Connection.send_packed_command)  # type: ignore[method-assign]
    allocator.FairAllocator.acquire = _noted_acquire(allocator.FairAllocator.acquire, folder)  # type: ignore[method-assign]
    server = RedisServer().start()
    bench = Bench(
        plan=make_plan(True, None),
        url=server.url,
        private=True,
        ctx=multiprocessing.get_context("fork"),
        progress=_Quiet(),
    )
    try:
        bench.run(args.only.split(","))
    finally:
        bench.close()
        server.close()
    lead: dict[str, int] = {}
    for name in glob.glob(f"{folder}/*"):
        with open(name, encoding="utf-8") as noted:
            for line in noted:
                ticket, ns = line.split()
                lead[ticket] = int(ns)
    for run in bench.library_runs:
        start, end = run.window
        grants = sorted((s for s in run.samples if start <= s.t_wait < end), key=lambda s: s.t_wait)
        leads = [lead[s.ticket] for s in grants if s.ticket in lead]
        order = run.arrival_order(ORDER_TIGHT_NS)
        print(
            f"{run.procs} processes, {run.resources} resource(s): {order.late} of {order.grants} "
            f"grants late by more than 1 ms; acquire called to its script call sent: "
            f"p50 {percentile(leads, 50) / 1e3:.0f} µs, p90 {percentile(leads, 90) / 1e3:.0f} µs, "
            f"p99 {percentile(leads, 99) / 1e3:.0f} µs, max {max(leads) / 1e3:.0f} µs"
        )
        before = after = sent_first = 0
        for i, g in enumerate(grants):
            # The grant h that called acquire after g and was seen soonest.
            passed = [h for h in grants[i + 1 :] if h.t_acquired < g.t_acquired - ORDER_TIGHT_NS]
            if not passed:
                continue
            h = min(passed, key=lambda s: s.t_acquired)
            if _ticket(h.ticket) < _ticket(g.ticket):
                before += 1
                if g.t_wait + lead.get(g.ticket, 0) < h.t_wait + lead.get(h.ticket, 0):
                    sent_first += 1
            else:
                after += 1
        print(
            f"  queued out of call order (h's ticket first): {before}, of which {sent_first} "
            f"with g's script call sent first; granted in order, seen late: {after}"
        )


if __name__ == "__main__":
    sys.exit(main())
