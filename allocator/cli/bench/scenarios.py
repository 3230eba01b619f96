"""The scenarios of ``allocator bench`` (see :mod:`allocator.cli.bench`).

:class:`Bench` runs each scenario against one server and turns what it
measured into table rows (:class:`allocator.cli.bench.stats.Row`), details for
the JSON report, and a list of problems seen on the way (worker errors, a
pool left in a wrong state): the benchmark doubles as a smoke test.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_pipes
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import attrs
import redis

from allocator.cli.bench.stats import (
    GrantSample,
    Row,
    Target,
    exclusivity_violations,
    fifo_violations,
    format_value,
    grant_order_mismatches,
    grants_per_worker,
    handoffs,
    jain_index,
    summarize,
    throughput,
)
from allocator.cli.bench.workers import (
    LIBRARY,
    SOCKET_TIMEOUT,
    TOKENS,
    ContendedSpec,
    WaitersSpec,
    contended_worker,
    waiters_helper,
)

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

    from allocator import FairAllocator, Lease
    from allocator.cli.bench import Plan, Progress

__all__ = ["Bench", "BenchError", "RunResult"]

# A waiting task and a held lease must outlive every scenario.
LONG_TTL = 3600.0


class BenchError(Exception):
    """A scenario could not be run (a worker failed, a reply was wrong)."""


# --- results of one contended run ------------------------------------------------


@attrs.frozen
class RunResult:
    """The grants of one contended run and what the server spent on them."""

    kind: str
    procs: int
    resources: int
    samples: list[GrantSample]
    window: tuple[int, int]
    errors: list[str]
    cpu_s: float
    commands: dict[str, tuple[int, int]] = attrs.field(factory=dict)

    @property
    def rate(self) -> float:
        return throughput(self.samples, *self.window)

    @property
    def jain(self) -> float:
        return jain_index(grants_per_worker(self.samples, self.procs, *self.window))

    @property
    def cpu_ns_per_grant(self) -> float | None:
        return self.cpu_s * 1e9 / len(self.samples) if self.samples else None

    def fifo(self) -> int:
        return fifo_violations((s.ticket, s.granted_at) for s in self.samples)

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "processes": self.procs,
            "resources": self.resources,
            "grants": len(self.samples),
            "window_s": (self.window[1] - self.window[0]) / 1e9,
            "grants_per_s": self.rate,
            "jain_index": self.jain,
            "grants_per_process": grants_per_worker(self.samples, self.procs, *self.window),
            "redis_cpu_s": self.cpu_s,
            "redis_cpu_ns_per_grant": self.cpu_ns_per_grant,
            "hold_ns": _summary_dict(s.t_release - s.t_acquired for s in self.samples),
            "errors": self.errors[:20],
            "error_count": len(self.errors),
            "overlapping_holds": exclusivity_violations(self.samples),
            "redis_commands_per_grant": _per_grant(self.commands, len(self.samples)),
        }
        if self.resources == 1:
            gaps = handoffs(self.samples, *self.window)
            out["handoff_from_release_call_ns"] = _summary_dict(gaps.from_call)
            out["handoff_from_release_return_ns"] = _summary_dict(gaps.from_return)
        if self.kind == LIBRARY:
            out["fifo_violations"] = self.fifo()
            if self.resources == 1:
                out["token_order_mismatches"] = grant_order_mismatches(
                    (s.token, s.ticket, s.granted_at) for s in self.samples
                )
        return out


def _summary_dict(values: Iterable[float]) -> dict[str, Any] | None:
    summary = summarize(list(values))
    return None if summary is None else summary.as_dict()


def _p(values: Sequence[float], which: str) -> float | None:
    summary = summarize(values)
    return None if summary is None else float(getattr(summary, which))


@attrs.define
class Probes:
    """Per-op latencies (ns) on the pool with waiters and the one without."""

    timeout: float = 0.0
    acquire: dict[str, list[int]] = attrs.field(factory=lambda: {"queued": [], "empty": []})
    renew: dict[str, list[int]] = attrs.field(factory=lambda: {"queued": [], "empty": []})
    renew_cmds: dict[str, dict[str, float]] = attrs.field(factory=dict)

    def details(self) -> dict[str, Any]:
        return {
            "probe_timeout": self.timeout,
            "acquire_probe_ns": {tag: _summary_dict(v) for tag, v in self.acquire.items()},
            "renew_ns": {tag: _summary_dict(v) for tag, v in self.renew.items()},
            "redis_commands_per_renew": self.renew_cmds,
        }


class ConnectionSampler:
    """Counts, from CLIENT LIST, the connections named ``name`` and those of
    them that wait (blocked on a command, or subscribed); keeps the maxima."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.samples = 0
        self.max_waiting = 0
        self.max_total = 0
        self.commands: set[str] = set()

    def sample(self) -> None:
        mine = [c for c in self.client.client_list() if c.get("name") == self.name]
        waiting = [c for c in mine if _is_waiting(c)]
        self.samples += 1
        self.max_waiting = max(self.max_waiting, len(waiting))
        self.max_total = max(self.max_total, len(mine))
        self.commands.update(c.get("cmd", "") for c in waiting)

    def details(self) -> dict[str, Any]:
        return {
            "waiting_connections_max": self.max_waiting,
            "helper_connections_max": self.max_total,
            "waiting_commands": sorted(self.commands),
            "connection_samples": self.samples,
        }


# --- the benchmark ------------------------------------------------------------------


class Bench:
    """One benchmark run against one server: runs scenarios, collects rows."""

    def __init__(
        self,
        *,
        plan: Plan,
        url: str,
        private: bool,
        ctx: BaseContext,
        progress: Progress,
    ) -> None:
        self.plan = plan
        self.url = url
        self.private = private
        self.ctx = ctx
        self.progress = progress
        self.prefix = f"allocbench-{uuid.uuid4().hex[:8]}"
        self.client = redis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, client_name=f"{self.prefix}-main"
        )
        self.redis_version = str(self.client.info("server").get("redis_version", "?"))
        self.rows: list[Row] = []
        self.details: dict[str, Any] = {}
        self.problems: list[str] = []
        self.failed_scenarios: list[str] = []
        self.library_runs: list[RunResult] = []
        self.token_runs: list[RunResult] = []
        self.task_fifo: tuple[int, int] | None = None  # (violations, grants)
        self._names = 0

    # -- plumbing

    def fresh(self, what: str) -> str:
        self._names += 1
        return f"bench-{what}-{self._names}"

    def pool(self, name: str, lease_ttl: float = 60.0) -> FairAllocator:
        from allocator import FairAllocator

        return FairAllocator(self.client, name, lease_ttl=lease_ttl, prefix=self.prefix)

    def used_memory(self) -> int:
        self.client.ping()  # let the server settle this connection's buffers
        return int(self.client.info("memory")["used_memory"])

    def command_stats(self) -> dict[str, tuple[int, int]]:
        """INFO commandstats as command -> (calls, usec). Commands run by
        scripts are counted too, and their time is inside the script's."""
        info = self.client.info("commandstats")
        return {
            key[len("cmdstat_") :]: (int(v["calls"]), int(v["usec"]))
            for key, v in info.items()
            if key.startswith("cmdstat_")
        }

    def cpu_seconds(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.rows.sort(key=lambda r: r.key)

    def close(self) -> None:
        if not self.private:
            self._delete_keys()
        self.client.close()

    def _delete_keys(self) -> None:
        # On a server we do not own, leave nothing behind. Pool keys start with
        # the pool's prefix; token lists were put under it too.
        try:
            batch: list[Any] = []
            for key in self.client.scan_iter(match=f"{self.prefix}*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    self.client.unlink(*batch)
                    batch = []
            if batch:
                self.client.unlink(*batch)
        except redis.RedisError as exc:
            self.problems.append(f"could not delete the benchmark's keys ({self.prefix}*): {exc}")

    def run(self, scenarios: Sequence[str]) -> None:
        steps: dict[str, Callable[[], None]] = {
            "uncontended": self.uncontended,
            "handoff": self.handoff,
            "throughput": self.throughput,
            "large": self.large,
            "waiters": self.waiters,
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

    # -- 1. uncontended cycle

    def uncontended(self) -> None:
        plan = self.plan
        self.progress.begin("uncontended acquire+release vs PING")
        pool = self.pool(self.fresh("uncontended"))
        pool.extend(["r0"])
        script = self.client.register_script("return 1")
        ping: list[int] = []
        evalsha: list[int] = []
        acquire: list[int] = []
        release: list[int] = []
        cycle: list[int] = []
        now = time.monotonic_ns
        warmup = min(200, plan.uncontended_samples // 10)
        for i in range(warmup + plan.uncontended_samples):
            # Interleaved sample by sample: whatever the machine does to one
            # series, it does to the others too.
            t0 = now()
            self.client.ping()
            t1 = now()
            script()
            t2 = now()
            lease = pool.acquire(timeout=10)
            t3 = now()
            pool.release(lease)
            t4 = now()
            if i >= warmup:
                ping.append(t1 - t0)
                evalsha.append(t2 - t1)
                acquire.append(t3 - t2)
                release.append(t4 - t3)
                cycle.append(t4 - t2)
            if i % 100 == 0:
                self.progress.update(f"{i}/{warmup + plan.uncontended_samples}")
        # Server time per script call, from INFO commandstats: what the Lua
        # itself costs, apart from the round trip.
        extra = max(1, min(500, plan.uncontended_samples // 4))
        stats0 = self.command_stats()
        for _ in range(extra):
            pool.release(pool.acquire(timeout=10))
        stats1 = self.command_stats()
        for _ in range(extra):
            script()
        stats2 = self.command_stats()
        lib_calls, lib_usec = _diff(stats0, stats1).get("evalsha", (0, 0))
        one_calls, one_usec = _diff(stats1, stats2).get("evalsha", (0, 0))
        lib_script_us = lib_usec / lib_calls if lib_calls else None
        one_script_us = one_usec / one_calls if one_calls else None
        self.details["uncontended"] = {
            "server_usec_per_library_call": lib_script_us,
            "library_calls_per_cycle": lib_calls / extra,
            "server_usec_per_return_1": one_script_us,
            "server_commands_per_cycle": _per_grant(_diff(stats0, stats1), extra),
            "ping_ns": _summary_dict(ping),
            "evalsha_return_1_ns": _summary_dict(evalsha),
            "acquire_ns": _summary_dict(acquire),
            "release_ns": _summary_dict(release),
            "cycle_ns": _summary_dict(cycle),
        }
        cycle_p50, ping_p50 = _p(cycle, "p50"), _p(ping, "p50")
        self.add(
            Row(
                "1",
                "uncontended acquire+release, p50",
                cycle_p50,
                "ns",
                ping_p50,
                "PING p50",
                Target("<=", 2.5),
                note=f"acquire p50 {format_value(_p(acquire, 'p50'), 'ns')}, "
                f"release p50 {format_value(_p(release, 'p50'), 'ns')}, "
                f"EVALSHA 'return 1' p50 {format_value(_p(evalsha, 'p50'), 'ns')}; "
                f"{lib_calls / extra:.2f} script calls per cycle; server time per call "
                f"{_us(lib_script_us)} (acquire/release) vs {_us(one_script_us)} ('return 1')",
            )
        )
        self.progress.end(
            f"cycle p50 {format_value(cycle_p50, 'ns')}, PING p50 {format_value(ping_p50, 'ns')}"
        )

    # -- contended runs (2, 3, 4, 8)

    def contended(self, kind: str, procs: int, resources: int, label: str) -> RunResult:
        plan = self.plan
        self.progress.begin(f"{label}, {'library' if kind == LIBRARY else 'token list'}")
        names = [f"r{i}" for i in range(resources)]
        if kind == LIBRARY:
            target = self.fresh(f"contended-{procs}x{resources}")
            pool = self.pool(target)
            pool.extend(names)
        else:
            target = f"{self.prefix}:tokens:{self.fresh('tokens')}"
            self.client.rpush(target, *names)
        run_ns = int((plan.warmup_s + plan.window_s) * 1e9)
        spec = ContendedSpec(
            kind=kind,
            url=self.url,
            target=target,
            prefix=self.prefix,
            hold_s=plan.hold_s,
            run_ns=run_ns,
            acquire_timeout=30.0,
            lease_ttl=60.0,
            client_name=f"{self.prefix}-worker",
        )
        pipes: list[Connection] = []
        processes: list[Any] = []
        finished = False
        try:
            for i in range(procs):
                parent, child = self.ctx.Pipe()
                proc = self.ctx.Process(  # type: ignore[attr-defined]
                    target=contended_worker, args=(i, spec, child), daemon=True
                )
                proc.start()
                child.close()
                pipes.append(parent)
                processes.append(proc)
            self._gather(pipes, "ready", timeout=120.0, detail=lambda n: f"{n}/{procs} ready")
            cpu0 = self.cpu_seconds()
            stats0 = self.command_stats()
            start_ns = time.monotonic_ns() + 100_000_000
            for conn in pipes:
                conn.send(start_ns)
            total_s = run_ns / 1e9

            def detail(n: int) -> str:
                elapsed = max(0.0, (time.monotonic_ns() - start_ns) / 1e9)
                return f"{min(elapsed, total_s):.1f}/{total_s:.1f} s, {procs} processes"

            replies = self._gather(pipes, "done", timeout=total_s + 120.0, detail=detail)
            cpu1 = self.cpu_seconds()
            stats1 = self.command_stats()
            finished = True
        finally:
            # After a failure the others may be parked on a resource that will
            # not come back: stop them at once rather than wait for their timeout.
            _stop(processes, grace=10.0 if finished else 0.0)
            for conn in pipes:
                conn.close()
        samples: list[GrantSample] = []
        errors: list[str] = []
        for reply in replies:
            samples.extend(GrantSample(*s) for s in reply["samples"])
            errors.extend(reply["errors"])
        window = (start_ns + int(plan.warmup_s * 1e9), start_ns + run_ns)
        result = RunResult(
            kind, procs, resources, samples, window, errors, cpu1 - cpu0, _diff(stats0, stats1)
        )
        if errors:
            self.problems.append(
                f"{label} ({kind}): {len(errors)} errors in workers, first: {errors[0]}"
            )
        overlaps = exclusivity_violations(samples)
        if overlaps:
            self.problems.append(f"{label} ({kind}): {overlaps} overlapping holds of one resource")
        if kind == LIBRARY:
            self._check_idle(pool, resources, label)
            self.library_runs.append(result)
        else:
            left = self.client.llen(target)
            if left != resources:
                self.problems.append(f"token list ended with {left} of {resources} tokens")
            self.token_runs.append(result)
        self.progress.end(f"{len(samples):,} grants, {result.rate:,.0f}/s")
        return result

    def _check_idle(self, pool: FairAllocator, resources: int, label: str) -> None:
        status = pool.status()
        if status.leased or status.waiting or status.free != resources:
            self.problems.append(
                f"{label}: after every worker released and left, status() says "
                f"free={status.free} leased={status.leased} waiting={status.waiting} "
                f"(expected free={resources}, 0, 0)"
            )

    def _gather(
        self,
        pipes: Sequence[Connection],
        expect: str,
        timeout: float,
        detail: Callable[[int], str],
    ) -> list[Any]:
        """One ``(expect, payload)`` message from every pipe, in pipe order."""
        got: dict[int, Any] = {}
        index = {id(conn): i for i, conn in enumerate(pipes)}
        deadline = time.monotonic() + timeout
        while len(got) < len(pipes):
            if time.monotonic() > deadline:
                raise BenchError(f"workers did not answer {expect!r} within {timeout:.0f} s")
            pending = [c for c in pipes if index[id(c)] not in got]
            for conn in wait_for_pipes(pending, timeout=0.1):
                assert isinstance(conn, Connection)
                i = index[id(conn)]
                try:
                    tag, payload = conn.recv()
                except EOFError:
                    raise BenchError(f"worker {i} exited without answering {expect!r}") from None
                if tag == "error":
                    raise BenchError(f"worker {i} failed:\n{payload}")
                if tag != expect:
                    raise BenchError(f"worker {i} said {tag!r}, expected {expect!r}")
                got[i] = payload
            self.progress.update(detail(len(got)))
        return [got[i] for i in range(len(pipes))]

    def _alternate(self, procs: int, resources: int, label: str) -> tuple[list[RunResult], ...]:
        """Library and token-list runs in ABBA order, so drift hits both alike."""
        lib: list[RunResult] = []
        tok: list[RunResult] = []
        for r in range(self.plan.rounds):
            order = (TOKENS, LIBRARY) if r % 2 == 0 else (LIBRARY, TOKENS)
            for kind in order:
                result = self.contended(kind, procs, resources, label)
                (lib if kind == LIBRARY else tok).append(result)
        return lib, tok

    def handoff(self) -> None:
        letters = iter("abcdefgh")
        for procs in self.plan.handoff_procs:
            label = f"handoff, 1 resource, {procs} processes"
            lib, tok = self._alternate(procs, 1, label)
            # Gated: from the holder calling release, which cannot be negative.
            # From release returning is kept for reference: both ends wait on
            # the same server turn, so that gap is mostly wake-up scheduling.
            lib_h = [handoffs(r.samples, *r.window) for r in lib]
            tok_h = [handoffs(r.samples, *r.window) for r in tok]
            lib_gaps = [g for h in lib_h for g in h.from_call]
            tok_gaps = [g for h in tok_h for g in h.from_call]
            lib_ret = [g for h in lib_h for g in h.from_return]
            tok_ret = [g for h in tok_h for g in h.from_return]
            self.details[f"handoff_{procs}"] = {
                "library_runs": [r.details() for r in lib],
                "token_runs": [r.details() for r in tok],
                "library_handoff_ns": _summary_dict(lib_gaps),
                "token_handoff_ns": _summary_dict(tok_gaps),
                "library_handoff_from_return_ns": _summary_dict(lib_ret),
                "token_handoff_from_return_ns": _summary_dict(tok_ret),
            }
            note = (
                f"from the holder calling release to the next holder's acquire returning "
                f"(from release returning instead: p50 {format_value(_p(lib_ret, 'p50'), 'ns')} "
                f"vs {format_value(_p(tok_ret, 'p50'), 'ns')}, "
                f"p99 {format_value(_p(lib_ret, 'p99'), 'ns')} "
                f"vs {format_value(_p(tok_ret, 'p99'), 'ns')}); "
                f"per grant the library sent {_commands_text(lib)}, "
                f"the token list {_commands_text(tok)}; "
                f"{len(lib_gaps):,} vs {len(tok_gaps):,} handoffs, "
                f"hold {self.plan.hold_s * 1e3:g} ms"
            )
            for which, bound in (("p50", 1.5), ("p99", 2.0)):
                self.add(
                    Row(
                        f"2{next(letters)}",
                        f"handoff {which}, 1 resource, {procs} procs",
                        _p(lib_gaps, which),
                        "ns",
                        _p(tok_gaps, which),
                        f"token list {which}",
                        Target("<=", bound),
                        note=note if which == "p50" else "",
                    )
                )

    def throughput(self) -> None:
        plan = self.plan
        procs, resources = plan.throughput_procs, plan.throughput_resources
        label = f"throughput, {resources} resources, {procs} processes"
        lib, tok = self._alternate(procs, resources, label)
        lib_rate = sum(r.rate for r in lib) / len(lib)
        tok_rate = sum(r.rate for r in tok) / len(tok)
        self.details["throughput"] = {
            "library_runs": [r.details() for r in lib],
            "token_runs": [r.details() for r in tok],
        }
        self.add(
            Row(
                "4",
                f"throughput, {resources} res x {procs} procs, hold {plan.hold_s * 1e3:g} ms",
                lib_rate,
                "/s",
                tok_rate,
                "token list",
                Target(">=", 0.9),
            )
        )
        lib_cpu = _cpu_per_grant(lib)
        tok_cpu = _cpu_per_grant(tok)
        self.add(
            Row(
                "8",
                "Redis CPU per grant (throughput runs)",
                lib_cpu,
                "ns",
                tok_cpu,
                "token list",
                None,
                note="INFO cpu used_cpu_user+used_cpu_sys over the whole run / grants; "
                f"per grant the library sent {_commands_text(lib)}, "
                f"the token list {_commands_text(tok)} (server time from INFO commandstats)",
            )
        )

    def fairness_rows(self) -> None:
        """Figure 3, from every library run that happened (and the asyncio tasks)."""
        if not self.library_runs and self.task_fifo is None:
            return
        violations = sum(r.fifo() for r in self.library_runs)
        grants = sum(len(r.samples) for r in self.library_runs)
        runs = len(self.library_runs)
        where = f"{runs} contended run{'' if runs == 1 else 's'}"
        if self.task_fifo is not None:
            violations += self.task_fifo[0]
            grants += self.task_fifo[1]
            where += " + asyncio tasks"
        self.add(
            Row(
                "3a",
                "FIFO violations (enqueue order)",
                float(violations),
                "",
                target=Target("<=", 0, on="value"),
                text=f"{violations} in {grants:,} grants",
                note=f"pairs granted against ticket order, over {where}",
            )
        )
        if self.library_runs:
            lib_j = min(r.jain for r in self.library_runs)
            tok_j = min(r.jain for r in self.token_runs) if self.token_runs else None
            self.add(
                Row(
                    "3b",
                    "Jain index of grants per process (min)",
                    lib_j,
                    "index",
                    tok_j,
                    "token list" if tok_j is not None else "",
                    Target(">=", 0.99, on="value"),
                )
            )

    # -- 5, 6: a large pool

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

    # -- 5, 6, 7: many waiters

    def waiters(self) -> None:
        plan = self.plan
        n = plan.waiters
        self.progress.begin(f"{n:,} waiting asyncio tasks")
        queued_name = self.fresh("waiters")
        pools = {
            "queued": self.pool(queued_name, lease_ttl=LONG_TTL),
            "empty": self.pool(self.fresh("nowaiters"), lease_ttl=LONG_TTL),
        }
        held: dict[str, Lease | None] = {}
        for tag, pool in pools.items():
            pool.extend(["r0"])
            held[tag] = pool.acquire(timeout=10)
        name = f"{self.prefix}-waiters"
        spec = WaitersSpec(
            url=self.url,
            pool=queued_name,
            prefix=self.prefix,
            client_name=name,
            max_connections=plan.helper_connections,
            wait_timeout=max(600.0, n * 0.05),
            lease_ttl=60.0,
        )
        parent, child = self.ctx.Pipe()
        helper = self.ctx.Process(  # type: ignore[attr-defined]
            target=waiters_helper, args=(spec, child), daemon=True
        )
        conns = ConnectionSampler(self.client, name)
        try:
            helper.start()
            child.close()
            self._expect(parent, "ready", 120.0)
            # Two stages: the first opens the helper's connections (and whatever
            # the library sets up per process), so the memory delta of the
            # second is the tickets' own.
            first = max(1, n // 10)
            parent.send(("enqueue", first))
            stage1 = self._expect(parent, "enqueued", 180.0)
            mem0 = self.used_memory()
            parent.send(("enqueue", n - first))
            self.progress.update(f"enqueueing {n:,}")
            stage2 = self._expect(parent, "enqueued", 180.0)
            mem1 = self.used_memory()
            if stage2["waiting"] != n:
                self.problems.append(
                    f"after enqueueing {n:,} tasks the pool says {stage2['waiting']} waiting"
                )
            for _ in range(3):
                conns.sample()
                time.sleep(0.05)
            probes = self._probe_queue(pools, held, conns)

            # Let them all through: each task releases as soon as it is served.
            parent.send(("finish", max(120.0, n * 0.05)))
            t_release = time.monotonic_ns()
            lease, held["queued"] = held["queued"], None
            assert lease is not None
            pools["queued"].release(lease)
            deadline = time.monotonic() + max(120.0, n * 0.05) + 60.0
            while not parent.poll(0.1):
                if time.monotonic() > deadline:
                    raise BenchError("the waiters helper did not finish")
                conns.sample()
                self.progress.update("serving")
            done = self._recv(parent, "done")
        finally:
            for tag, current in held.items():
                if current is not None:
                    pools[tag].release(current)
            if helper.is_alive():
                with contextlib.suppress(OSError):
                    parent.send(("quit", None))
            _stop([helper], grace=30.0)
            parent.close()

        per_ticket = (mem1 - mem0) / (n - first)
        grants = [tuple(g) for g in done["grants"]]
        served = len(grants)
        violations = fifo_violations((g[1], g[2]) for g in grants)
        mismatches = grant_order_mismatches((g[3], g[1], g[2]) for g in grants)
        self.task_fifo = (violations, served)
        serve_s = (max((g[4] for g in grants), default=t_release) - t_release) / 1e9
        if done["errors"]:
            self.problems.append(
                f"{len(done['errors'])} asyncio tasks failed, first: {done['errors'][0]}"
            )
        if mismatches:
            self.problems.append(
                f"asyncio tasks: token order and (granted_at, ticket) order disagree on "
                f"{mismatches} pairs"
            )
        self.details["waiters"] = {
            "tasks": n,
            "stage1": {k: v for k, v in stage1.items() if k != "errors"},
            "stage2": {k: v for k, v in stage2.items() if k != "errors"},
            "used_memory_delta": mem1 - mem0,
            "bytes_per_ticket": per_ticket,
            **probes.details(),
            "served": served,
            "unfinished": done["unfinished"],
            "fifo_violations": violations,
            "token_order_mismatches": mismatches,
            "serve_all_s": serve_s,
            "errors": done["errors"][:20],
            **conns.details(),
        }
        op = f"acquire(timeout={probes.timeout:g})"
        self.add(
            Row(
                "5c",
                f"{op} p50, {n:,} waiting",
                _p(probes.acquire["queued"], "p50"),
                "ns",
                _p(probes.acquire["empty"], "p50"),
                "no waiters",
                Target("<=", 1.3),
                note="enqueues behind the waiters and leaves (the resource is held)",
            )
        )
        self.add(
            Row(
                "5d",
                f"renew p50, {n:,} waiting",
                _p(probes.renew["queued"], "p50"),
                "ns",
                _p(probes.renew["empty"], "p50"),
                "no waiters",
                Target("<=", 1.3),
                note=_extra_commands(probes.renew_cmds["queued"], probes.renew_cmds["empty"]),
            )
        )
        self.add(
            Row(
                "6b",
                "Redis memory per waiting ticket",
                per_ticket,
                "B",
                target=Target("<=", 300, on="value", unit="B"),
                note=f"used_memory delta over the last {n - first:,} of {n:,} waiters",
            )
        )
        self.add(
            Row(
                "7a",
                f"{n:,} asyncio tasks served, in order",
                float(n - served + violations),
                "",
                target=Target("<=", 0, on="value"),
                text=f"{served:,}/{n:,}, {violations} out of order",
                note=f"all served {serve_s:.2f} s after the lease was released "
                f"({served / max(serve_s, 1e-9):,.0f} grants/s)",
            )
        )
        self.add(
            Row(
                "7b",
                "connections used for waiting (max)",
                float(conns.max_waiting),
                "",
                target=Target("<=", 2, on="value"),
                note=f"blocked or subscribed connections of the helper process, from "
                f"{conns.samples} CLIENT LIST samples "
                f"(commands: {', '.join(sorted(conns.commands)) or '-'}); "
                f"{conns.max_total} connections in all at most, client pool limit "
                f"{plan.helper_connections}",
            )
        )
        self.progress.end(
            f"{served:,}/{n:,} served in {serve_s:.1f} s, {violations} out of order, "
            f"{format_value(per_ticket, 'B')}/ticket"
        )

    def _probe_queue(
        self,
        pools: dict[str, FairAllocator],
        held: dict[str, Lease | None],
        conns: ConnectionSampler,
    ) -> Probes:
        """Time ``acquire(timeout=0)`` and ``renew`` on the pool with waiters
        (``"queued"``) and the one without (``"empty"``), sample by sample in
        alternating order; the resource of each is held, so every acquire
        enqueues and leaves."""
        from allocator import AcquireTimeout

        plan = self.plan
        probes = Probes()
        granted = 0
        now = time.monotonic_ns
        warmup = min(100, plan.op_samples // 10)
        for i in range(warmup + plan.op_samples):
            order = ("empty", "queued") if i % 2 == 0 else ("queued", "empty")
            for tag in order:
                t0 = now()
                try:
                    lease = pools[tag].acquire(timeout=probes.timeout)
                except AcquireTimeout:
                    lease = None
                except ValueError as exc:
                    if probes.timeout > 0:
                        raise
                    self.problems.append(
                        f"acquire(timeout=0) raised {exc!r}; probing with timeout=0.001"
                    )
                    probes.timeout = 0.001
                    continue
                t1 = now()
                if lease is not None:
                    granted += 1
                    pools[tag].release(lease)
                elif i >= warmup:
                    probes.acquire[tag].append(t1 - t0)
            for tag in order:
                t0 = now()
                self._renew(pools, held, tag)
                t1 = now()
                if i >= warmup:
                    probes.renew[tag].append(t1 - t0)
            if i % 100 == 0:
                self.progress.update(f"probes {i}/{warmup + plan.op_samples}")
            if i % 500 == 0:
                conns.sample()
        if granted:
            self.problems.append(
                f"acquire(timeout={probes.timeout:g}) was granted {granted} times "
                "while the only resource was held"
            )
        # What the server runs per renew, with and without a queue behind.
        for tag in ("queued", "empty"):
            probes.renew_cmds[tag] = self._commands_per_call(
                functools.partial(self._renew, pools, held, tag), 200
            )
        return probes

    @staticmethod
    def _renew(pools: dict[str, FairAllocator], held: dict[str, Lease | None], tag: str) -> None:
        current = held[tag]
        assert current is not None
        held[tag] = pools[tag].renew(current)

    def _commands_per_call(self, fn: Callable[[], object], n: int) -> dict[str, float]:
        """Commands the server ran per call of ``fn`` (scripts' inner ones included)."""
        before = self.command_stats()
        for _ in range(n):
            fn()
        after = self.command_stats()
        return {cmd: calls / n for cmd, (calls, _) in _diff(before, after).items() if cmd != "info"}

    def _expect(self, conn: Connection, tag: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not conn.poll(0.1):
            if time.monotonic() > deadline:
                raise BenchError(f"the waiters helper did not say {tag!r} within {timeout:.0f} s")
            self.progress.update(f"waiting for helper: {tag}")
        return self._recv(conn, tag)

    @staticmethod
    def _recv(conn: Connection, tag: str) -> Any:
        try:
            got, payload = conn.recv()
        except EOFError:
            raise BenchError(f"the waiters helper exited before {tag!r}") from None
        if got == "error":
            raise BenchError(f"the waiters helper failed:\n{payload}")
        if got != tag:
            raise BenchError(f"the waiters helper said {got!r}, expected {tag!r}")
        return payload

    # -- output

    def header(self, start_method: str) -> str:
        where = urlsplit(self.url)
        server = "private redis-server" if self.private else "server from --url"
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


_BLOCKING_COMMANDS = frozenset(
    {
        "blpop", "brpop", "blmove", "brpoplpush", "blmpop", "bzpopmin", "bzpopmax",
        "bzmpop", "xread", "xreadgroup", "subscribe", "psubscribe", "ssubscribe",
    }
)  # fmt: skip


def _is_waiting(client: dict[str, str]) -> bool:
    """A connection parked on a blocking command or a subscription."""
    flags = client.get("flags", "")
    return "b" in flags or "P" in flags or client.get("cmd", "") in _BLOCKING_COMMANDS


def _stop(processes: Sequence[Any], grace: float) -> None:
    """Join ``processes`` within ``grace`` seconds in all, then terminate the rest."""
    deadline = time.monotonic() + grace
    for proc in processes:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join()


def _diff(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    out = {}
    for cmd, (calls, usec) in after.items():
        c0, u0 = before.get(cmd, (0, 0))
        if calls > c0:
            out[cmd] = (calls - c0, usec - u0)
    return out


def _per_grant(commands: dict[str, tuple[int, int]], grants: int) -> dict[str, Any]:
    """Calls per grant and server time per call, by command."""
    if not grants:
        return {}
    return {
        cmd: {"calls_per_grant": calls / grants, "usec_per_call": usec / calls}
        for cmd, (calls, usec) in sorted(commands.items())
    }


# What a client sends itself; the rest of commandstats is run inside scripts.
_CLIENT_COMMANDS = ("evalsha", "eval", "blpop", "rpush", "lpush", "script|load")


def _commands_text(runs: Sequence[RunResult]) -> str:
    """``2.00 EVALSHA (95 µs each) + 1.00 BLPOP`` per grant, over ``runs``."""
    grants = sum(len(r.samples) for r in runs)
    if not grants:
        return "-"
    total: dict[str, list[int]] = {}
    for r in runs:
        for cmd, (calls, usec) in r.commands.items():
            acc = total.setdefault(cmd, [0, 0])
            acc[0] += calls
            acc[1] += usec
    parts = []
    for cmd in _CLIENT_COMMANDS:
        if cmd in total:
            calls, usec = total[cmd]
            text = f"{calls / grants:.2f} {cmd.upper()}"
            if cmd in ("evalsha", "eval"):
                text += f" ({usec / calls:.0f} µs each)"
            parts.append(text)
    return " + ".join(parts) or "-"


def _extra_commands(with_: dict[str, float], without: dict[str, float], what: str = "renew") -> str:
    """The commands one call runs more often in the first case than the second."""
    extra = {
        cmd: n - without.get(cmd, 0.0)
        for cmd, n in with_.items()
        if n - without.get(cmd, 0.0) >= 0.05
    }
    if not extra:
        return f"each {what} runs the same commands on the server either way"
    listed = ", ".join(f"{cmd.upper()} +{n:.2f}" for cmd, n in sorted(extra.items()))
    return f"with waiters each {what} also runs: {listed}"


def _us(usec: float | None) -> str:
    return "-" if usec is None else f"{usec:.1f} µs"


def _cpu_per_grant(runs: Sequence[RunResult]) -> float | None:
    grants = sum(len(r.samples) for r in runs)
    return sum(r.cpu_s for r in runs) * 1e9 / grants if grants else None
