"""The scenarios of ``allocator bench`` (see :mod:`allocator.cli.bench`).

:class:`Bench` runs each scenario against one server and turns what it
measured into table rows (:class:`allocator.cli.bench.stats.Row`), details for
the JSON report, and a list of problems seen on the way (worker errors, a
pool left in a wrong state): the benchmark doubles as a smoke test.
"""

from __future__ import annotations

import os
import platform
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs
import redis

from allocator.cli.bench.base import (
    BenchError,
    RunResult,
)
from allocator.cli.bench.contended import Contended
from allocator.cli.bench.large import Large
from allocator.cli.bench.stats import (
    format_value,
)
from allocator.cli.bench.tenants import Tenants
from allocator.cli.bench.uncontended import Uncontended
from allocator.cli.bench.waiters import Waiters

__all__ = ["Bench", "BenchError", "RunResult"]


class Bench(Uncontended, Contended, Large, Waiters, Tenants):
    """One benchmark run against one server: runs the scenarios (one class
    each, in their own modules), collects rows, writes the report."""

    def run(self, scenarios: Sequence[str]) -> None:
        steps: dict[str, Callable[[], None]] = {
            "uncontended": self.uncontended,
            "handoff": self.handoff,
            "throughput": self.throughput,
            "large": self.large,
            "waiters": self.waiters,
            "tenants": self.tenants,
        }
        for name in scenarios:
            try:
                steps[name]()
            except (BenchError, redis.RedisError, Exception) as exc:
                # One broken scenario must not hide the others' figures.
                self.failed_scenarios.append(name)
                self.problems.append(f"scenario {name} failed: {exc}")
                self.details.setdefault("tracebacks", {})[name] = traceback.format_exc()
                self.progress.end(f"FAILED: {str(exc).splitlines()[0] if str(exc) else exc!r}")
        self.fairness_rows()

    def header(self, start_method: str) -> str:
        where = urlsplit(self.url)
        server = "private redis-server" if self.private else "server from --url"
        if self.cluster:
            server = "Redis Cluster node from --url, the run's pools in its slots"
        return (
            f"allocator bench, {self.plan.describe()}\n"
            f"redis {self.redis_version} ({server} at {where.hostname}:{where.port}), "
            f"{os.cpu_count()} CPUs, Python {platform.python_version()} on {platform.system()}, "
            f"workers started by {start_method}\n"
            "Machines are noisy: each figure is measured beside its baseline in this run; "
            "only ratios are comparable."
        )

    def baseline_text(self) -> str:
        lines = ["baselines (same run):"]
        unc = self.details.get("uncontended")
        if unc:
            for label, key in (("PING", "ping_ns"), ("EVALSHA 'return 1'", "evalsha_return_1_ns")):
                s = unc[key]
                if s:
                    lines.append(
                        f"  {label}: p50 {format_value(s['p50'], 'ns')}, "
                        f"p99 {format_value(s['p99'], 'ns')}"
                    )
        for procs in self.plan.handoff_procs:
            d = self.details.get(f"handoff_{procs}")
            if d and d["token_handoff_ns"]:
                s = d["token_handoff_ns"]
                lines.append(
                    f"  token list handoff, {procs} processes: p50 {format_value(s['p50'], 'ns')}, "
                    f"p99 {format_value(s['p99'], 'ns')}"
                )
        if self.token_runs:
            j = min(r.jain for r in self.token_runs)
            lines.append(f"  token list Jain index (min over runs): {j:.4f}")
        if len(lines) == 1:
            lines.append("  (none measured)")
        return "\n".join(lines)

    def report(self, *, started: float, finished: float, version: str) -> dict[str, Any]:
        parts = urlsplit(self.url)
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return {
            "tool": "allocator bench",
            "allocator_version": version,
            "mode": "quick" if self.plan.quick else "full",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "elapsed_s": finished - started,
            "host": {
                "platform": platform.platform(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
            },
            "redis": {
                "version": self.redis_version,
                "url": urlunsplit((parts.scheme, netloc, parts.path, "", "")),
                "private": self.private,
            },
            "plan": attrs.asdict(self.plan),
            "rows": [row.as_dict() for row in self.rows],
            "passed": all(row.passed is not False for row in self.rows)
            and not self.failed_scenarios,
            "failed_scenarios": self.failed_scenarios,
            "problems": self.problems,
            "details": self.details,
        }
