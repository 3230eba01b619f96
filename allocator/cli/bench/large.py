"""``allocator bench``: per-operation latency and memory with a very large pool."""

from __future__ import annotations

import time

from allocator.cli.bench.base import (
    LONG_TTL,
    BenchBase,
    BenchError,
    _p,
    _summary_dict,
)
from allocator.cli.bench.stats import (
    Row,
    Target,
    format_value,
)

__all__ = ["Large"]


class Large(BenchBase):
    """Per-operation latency and memory with a very large pool."""

    def large(self) -> None:
        plan = self.plan
        n = plan.big_resources
        self.progress.begin(f"{n:,} resources vs {plan.small_resources}")
        small = self.pool(self.fresh("small"), lease_ttl=LONG_TTL)
        small.extend([f"s{i}" for i in range(plan.small_resources)])
        big = self.pool(self.fresh("large"), lease_ttl=LONG_TTL)
        names = [f"res-{i:06d}" for i in range(n)]
        chunk = min(plan.extend_chunk, max(1, n // 10))
        t0 = time.monotonic()
        added = big.extend(names[:chunk])
        mem0 = self.used_memory()
        for k in range(chunk, n, chunk):
            added += big.extend(names[k : k + chunk])
            self.progress.update(f"extend {k + chunk:,}/{n:,}")
        extend_s = time.monotonic() - t0
        mem1 = self.used_memory()
        if added != n:
            self.problems.append(f"extend of {n:,} new resources returned {added:,} in total")
        per_resource = (mem1 - mem0) / (n - chunk)

        held = {"small": small.acquire(blocking=False), "large": big.acquire(blocking=False)}
        if held["small"] is None or held["large"] is None:
            raise BenchError("acquire(blocking=False) on a pool of free resources returned None")
        pools = {"small": small, "large": big}
        cycle: dict[str, list[int]] = {"small": [], "large": []}
        renew: dict[str, list[int]] = {"small": [], "large": []}
        nones = 0
        now = time.monotonic_ns
        warmup = min(200, plan.op_samples // 10)
        for i in range(warmup + plan.op_samples):
            order = ("small", "large") if i % 2 == 0 else ("large", "small")
            for tag in order:
                t0n = now()
                lease = pools[tag].acquire(blocking=False)
                if lease is None:
                    nones += 1
                    continue
                pools[tag].release(lease)
                t1n = now()
                if i >= warmup:
                    cycle[tag].append(t1n - t0n)
            for tag in order:
                current = held[tag]
                assert current is not None
                t0n = now()
                held[tag] = pools[tag].renew(current)
                t1n = now()
                if i >= warmup:
                    renew[tag].append(t1n - t0n)
            if i % 100 == 0:
                self.progress.update(f"ops {i}/{warmup + plan.op_samples}")
        for tag, lease in held.items():
            if lease is not None:
                pools[tag].release(lease)
        if nones:
            self.problems.append(
                f"acquire(blocking=False) returned None {nones} times on pools with free resources"
            )
        self.details["large"] = {
            "resources": n,
            "small_resources": plan.small_resources,
            "extend_s": extend_s,
            "extend_per_s": n / extend_s if extend_s > 0 else None,
            "used_memory_delta": mem1 - mem0,
            "bytes_per_resource": per_resource,
            "cycle_ns": {tag: _summary_dict(v) for tag, v in cycle.items()},
            "renew_ns": {tag: _summary_dict(v) for tag, v in renew.items()},
        }
        self.add(
            Row(
                "5a",
                f"acquire(blocking=False)+release p50, {n:,} res",
                _p(cycle["large"], "p50"),
                "ns",
                _p(cycle["small"], "p50"),
                f"{plan.small_resources} resources",
                Target("<=", 1.3),
            )
        )
        self.add(
            Row(
                "5b",
                f"renew p50, {n:,} resources",
                _p(renew["large"], "p50"),
                "ns",
                _p(renew["small"], "p50"),
                f"{plan.small_resources} resources",
                Target("<=", 1.3),
            )
        )
        self.add(
            Row(
                "6a",
                "Redis memory per resource",
                per_resource,
                "B",
                target=Target("<=", 300, on="value", unit="B"),
                note=f"used_memory delta over {n - chunk:,} resources; extend took "
                f"{extend_s:.2f} s ({n / max(extend_s, 1e-9):,.0f} resources/s, "
                f"chunks of {chunk:,})",
            )
        )
        self.progress.end(f"{format_value(per_resource, 'B')}/resource, extend {extend_s:.1f} s")
