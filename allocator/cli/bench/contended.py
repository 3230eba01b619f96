"""``allocator bench``: hand-off, throughput and fairness under contention,
next to a token-list pool."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_pipes
from typing import TYPE_CHECKING, Any

from allocator.cli.bench.base import (
    ORDER_SLACK_NS,
    ORDER_TIGHT_NS,
    BenchBase,
    BenchError,
    RunResult,
    _arrival_order_dict,
    _commands_text,
    _cpu_per_grant,
    _diff,
    _p,
    _stop,
    _summary_dict,
)
from allocator.cli.bench.stats import (
    ArrivalOrder,
    GrantSample,
    Row,
    Target,
    exclusivity_violations,
    format_value,
    handoffs,
)
from allocator.cli.bench.workers import (
    LIBRARY,
    TOKENS,
    ContendedSpec,
    contended_worker,
)

if TYPE_CHECKING:
    from allocator import FairAllocator

__all__ = ["Contended"]


class Contended(BenchBase):
    """Hand-off, throughput and fairness under contention, next to a token-list pool."""

    def contended(self, kind: str, procs: int, resources: int, label: str) -> RunResult:
        plan = self.plan
        self.progress.begin(f"{label}, {'library' if kind == LIBRARY else 'token list'}")
        names = [f"r{i}" for i in range(resources)]
        if kind == LIBRARY:
            target = self.fresh(f"contended-{procs}x{resources}")
            pool = self.pool(target)
            pool.extend(names)
        else:
            # The name as a hash tag: the list lives where the pools do.
            target = f"{self.prefix}:tokens:{{{self.fresh('tokens')}}}"
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
            cluster=self.cluster,
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
            self._arrival_order_row()

    def _arrival_order_row(self) -> None:
        """Figure 3c: grants that a later arrival was served well before, as
        the clients saw them, in the library's runs and the token list's."""
        lib = _merge_arrival_order(self.library_runs)
        tok = _merge_arrival_order(self.token_runs) if self.token_runs else None
        slack = format_value(ORDER_SLACK_NS, "ns")
        self.details["arrival_order"] = {
            "library": _arrival_order_dict(lib),
            "token_list": None if tok is None else _arrival_order_dict(tok),
        }
        runs = len(self.library_runs)
        note = (
            f"a grant counts when a process that started its acquire after it saw its own "
            f"acquire return more than {slack} earlier (client clocks, so scheduling "
            f"delays count too); acquires started in the measuring window of {runs} "
            f"contended run{'' if runs == 1 else 's'}"
        )
        if tok is not None:
            note += f" each; token list: {tok.late} in {tok.grants:,} grants"
        self.add(
            Row(
                "3c",
                f"grants seen out of arrival order > {slack}",
                float(lib.late),
                "",
                None if tok is None else float(tok.late),
                "" if tok is None else f"token list, worst {format_value(tok.worst_ns, 'ns')}",
                Target("<=", 0, on="value"),
                text=f"{lib.late} in {lib.grants:,} grants, "
                f"worst {format_value(lib.worst_ns, 'ns')}",
                note=note,
            )
        )
        # 3d: the same, more strictly.
        lib = _merge_arrival_order(self.library_runs, ORDER_TIGHT_NS)
        tok = _merge_arrival_order(self.token_runs, ORDER_TIGHT_NS) if self.token_runs else None
        tight = format_value(ORDER_TIGHT_NS, "ns")
        self.details["arrival_order_tight"] = {
            "library": _arrival_order_dict(lib, ORDER_TIGHT_NS),
            "token_list": None if tok is None else _arrival_order_dict(tok, ORDER_TIGHT_NS),
        }
        self.add(
            Row(
                "3d",
                f"grants seen out of arrival order > {tight}",
                float(lib.late),
                "",
                None if tok is None else float(tok.late),
                "" if tok is None else "token list",
                Target("<=", 0, on="value"),
                text=f"{lib.late} in {lib.grants:,} grants",
                note=f"as 3c, a lead of more than {tight}",
            )
        )


def _merge_arrival_order(
    runs: Sequence[RunResult], more_than_ns: int = ORDER_SLACK_NS
) -> ArrivalOrder:
    """Counted run by run (arrivals are compared within one run), then added up;
    the worst is the worst of any run."""
    found = [r.arrival_order(more_than_ns) for r in runs]
    return ArrivalOrder(
        grants=sum(f.grants for f in found),
        late=sum(f.late for f in found),
        worst_ns=max((f.worst_ns for f in found), default=0),
    )
