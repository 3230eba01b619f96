"""``allocator bench``: two tenants on one pool (docs/concepts.md#tenants).

Tenant ``burst`` queues a burst of requests at once, and the next as soon as
it is served; tenant ``lone`` sends one request now and then. The same load
runs on a pool in the order ``fifo`` and on one in the order ``tenant``, in
alternating runs: the lone request's wait in each (figures 9a, 9b: under
``fifo`` it waits behind what is left of the burst, under ``tenant`` for
about one hold), and the Redis CPU time per grant in each (9c: what the
tenant index costs a grant).
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_pipes
from typing import Any

from allocator.cli.bench.base import BenchBase, BenchError, _p, _stop, _summary_dict
from allocator.cli.bench.stats import Row, Target, format_value
from allocator.cli.bench.workers import TenantsSpec, tenants_worker

__all__ = ["Tenants"]

ORDERS = ("fifo", "tenant")


class Tenants(BenchBase):
    """The lone request's wait and the cost per grant, fifo against tenant."""

    def tenants(self) -> None:
        plan = self.plan
        runs: dict[str, list[dict[str, Any]]] = {order: [] for order in ORDERS}
        for r in range(plan.rounds):
            for order in ORDERS if r % 2 == 0 else ORDERS[::-1]:
                runs[order].append(self._tenants_run(order))
        waits = {o: [w for run in runs[o] for w in run["waits_ns"]] for o in ORDERS}
        cpu = {
            o: sum(run["cpu_s"] for run in runs[o])
            * 1e9
            / max(1, sum(run["grants"] for run in runs[o]))
            for o in ORDERS
        }
        self.details["tenants"] = {
            order: {
                "runs": [{k: v for k, v in run.items() if k != "waits_ns"} for run in runs[order]],
                "lone_wait_ns": _summary_dict(waits[order]),
                "redis_cpu_ns_per_grant": cpu[order],
            }
            for order in ORDERS
        }
        note = (
            f"tenant 'burst' queues {plan.tenant_burst} requests at once, again as soon as "
            f"they are served; tenant 'lone' one every {plan.tenant_gap_s * 1e3:g} ms; "
            f"{plan.tenant_resources} resources, hold {plan.tenant_hold_s * 1e3:g} ms; "
            f"{len(waits['tenant']):,} vs {len(waits['fifo']):,} lone requests"
        )
        for key, which, bound in (("9a", "p50", 0.5), ("9b", "p99", 0.5)):
            self.add(
                Row(
                    key,
                    f"lone tenant's wait {which}, order tenant vs fifo",
                    _p(waits["tenant"], which),
                    "ns",
                    _p(waits["fifo"], which),
                    "order fifo",
                    Target("<=", bound),
                    note=note if which == "p50" else "",
                )
            )
        self.add(
            Row(
                "9c",
                "Redis CPU per grant, order tenant vs fifo",
                cpu["tenant"],
                "ns",
                cpu["fifo"],
                "order fifo",
                Target("<=", 1.5),
                note="INFO cpu over each run / its grants (both tenants), the same load; "
                "what the tenant index (two sorted sets and a hash, O(log n) a change) "
                "costs a grant and a queued request",
            )
        )

    def _tenants_run(self, order: str) -> dict[str, Any]:
        plan = self.plan
        self.progress.begin(f"two tenants, order {order}")
        name = self.fresh(f"tenants-{order}")
        pool = self.pool(name)
        pool.extend([f"r{i}" for i in range(plan.tenant_resources)])
        pool.set_order(order)
        run_ns = int(plan.window_s * 1e9)
        pipes: list[Connection] = []
        processes: list[Any] = []
        finished = False
        try:
            for role in ("burst", "lone"):
                spec = TenantsSpec(
                    role=role,
                    url=self.url,
                    pool=name,
                    prefix=self.prefix,
                    burst=plan.tenant_burst,
                    hold_s=plan.tenant_hold_s,
                    gap_s=plan.tenant_gap_s,
                    run_ns=run_ns,
                    client_name=f"{self.prefix}-{role}",
                    cluster=self.cluster,
                )
                parent, child = self.ctx.Pipe()
                proc = self.ctx.Process(  # type: ignore[attr-defined]
                    target=tenants_worker, args=(spec, child), daemon=True
                )
                proc.start()
                child.close()
                pipes.append(parent)
                processes.append(proc)
            self._tenants_gather(pipes, "ready", 120.0)
            cpu0 = self.cpu_seconds()
            start_ns = time.monotonic_ns() + 100_000_000
            for conn in pipes:
                conn.send(start_ns)
            burst, lone = self._tenants_gather(pipes, "done", run_ns / 1e9 + 120.0)
            cpu1 = self.cpu_seconds()
            finished = True
        finally:
            _stop(processes, grace=10.0 if finished else 0.0)
            for conn in pipes:
                conn.close()
        errors = burst["errors"] + lone["errors"]
        if errors:
            self.problems.append(f"two tenants, order {order}: {len(errors)} errors: {errors[0]}")
        status = pool.status()
        if status.leased or status.waiting:
            self.problems.append(
                f"two tenants, order {order}: after the run status() says leased="
                f"{status.leased} waiting={status.waiting} (expected 0, 0)"
            )
        waits = lone["waits_ns"]
        self.progress.end(
            f"{burst['grants'] + lone['grants']:,} grants, lone wait p50 "
            f"{format_value(_p(waits, 'p50'), 'ns')}"
        )
        return {
            "grants": burst["grants"] + lone["grants"],
            "burst_grants": burst["grants"],
            "lone_grants": lone["grants"],
            "cpu_s": cpu1 - cpu0,
            "waits_ns": waits,
        }

    def _tenants_gather(self, pipes: list[Connection], expect: str, timeout: float) -> list[Any]:
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(pipes):
            if time.monotonic() > deadline:
                raise BenchError(f"tenant workers did not answer {expect!r} within {timeout:.0f} s")
            for conn in wait_for_pipes([c for i, c in enumerate(pipes) if i not in got], 0.1):
                assert isinstance(conn, Connection)
                i = pipes.index(conn)
                try:
                    tag, payload = conn.recv()
                except EOFError:
                    raise BenchError(f"tenant worker {i} exited without {expect!r}") from None
                if tag == "error":
                    raise BenchError(f"tenant worker {i} failed:\n{payload}")
                if tag != expect:
                    raise BenchError(f"tenant worker {i} said {tag!r}, expected {expect!r}")
                got[i] = payload
            self.progress.update(f"{len(got)}/{len(pipes)} {expect}")
        return [got[i] for i in range(len(pipes))]
