"""``allocator bench``: measure the library next to its baselines, in one run.

The machine a benchmark runs on is noisy, so no figure is reported alone: each
is measured beside a baseline taken in the same run (interleaved sample by
sample, or in alternating runs), and only the ratio is judged against its
target. Baselines: a PING round trip, an EVALSHA of ``return 1``, and a
"token list" pool (free resources in a Redis list; acquire = BLPOP, release =
RPUSH) driven by the same worker processes as the library.

Scenarios (``--only`` picks some) and the figures they give:

``uncontended``  1   acquire+release cycle vs PING
                 1f  the floor's cycle vs PING: a bare library that sends only
                     a grant's commands (:mod:`.floor`), in a pass of its own
``handoff``      2   release -> next acquire, 1 resource, 8 and 32 processes
                 3   FIFO violations and Jain fairness (also from the others),
                     grants seen out of arrival order by more than 5 ms
                     and by more than 1 ms (library and token list, in
                     the handoff and throughput runs)
``throughput``   4   grants/s, several resources, 4 processes per resource
                 8   Redis CPU time per grant
``large``        5   per-op latency at 100,000 resources vs 10
                 6   Redis memory per resource
``waiters``      5   per-op latency with 10,000 waiting tickets vs none
                 6   Redis memory per waiting ticket
                 7   10,000 asyncio tasks in one process: served in order,
                     the commands a second the waiting process sends,
                     on at most 2 waiting connections
``tenants``      9   two tenants, one queueing bursts of 50, the other a
                     request now and then: the lone request's wait and the
                     Redis CPU per grant, order tenant vs fifo

The scenarios live in one module each (:mod:`.uncontended`, :mod:`.contended`,
:mod:`.large`, :mod:`.waiters`, :mod:`.tenants`, on :mod:`.base`; :mod:`.scenarios` puts them
together), the arithmetic in
:mod:`allocator.cli.bench.stats` (pure, unit-tested), the worker processes in
:mod:`allocator.cli.bench.workers`.

Exit status of :func:`run`: 0 when every target is met, 1 when one is missed,
a scenario could not run, or the benchmark could not start at all (the
table of :data:`allocator.cli.EXIT_CODES`). ``--url`` may name a node of a
Redis Cluster: the run's pools are then placed in that node's slots.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import attrs
import redis

import allocator
from allocator.cli._common import CommandError, describe, positive_float, safe_url
from allocator.cli.bench.scenarios import Bench, BenchError
from allocator.cli.bench.stats import format_table

__all__ = ["SCENARIOS", "Plan", "Progress", "add_arguments", "make_plan", "register", "run"]


def register(commands: Any) -> None:
    """The ``bench`` subcommand."""
    bench = commands.add_parser(
        "bench", help="measure latency, fairness and cost against baselines"
    )
    add_arguments(bench)
    bench.set_defaults(run=run)


SCENARIOS = ("uncontended", "handoff", "throughput", "large", "waiters", "tenants")


@attrs.frozen
class Plan:
    """Sizes and sample counts of one run (``--quick`` or full)."""

    quick: bool
    uncontended_samples: int
    op_samples: int
    warmup_s: float
    window_s: float
    rounds: int
    handoff_procs: tuple[int, ...]
    throughput_procs: int
    throughput_resources: int
    hold_s: float
    small_resources: int
    big_resources: int
    waiters: int
    extend_chunk: int = 1000
    helper_connections: int = 16
    #: The ``tenants`` scenario: a burst's size, the pool's resources, the
    #: hold of a lease and the lone tenant's gap between two requests.
    tenant_burst: int = 50
    tenant_resources: int = 2
    tenant_hold_s: float = 0.002
    tenant_gap_s: float = 0.02

    def describe(self) -> str:
        mode = "quick mode (fewer samples, 8 processes only)" if self.quick else "full mode"
        return (
            f"{mode}: {self.window_s:g} s windows x {self.rounds} round(s), "
            f"handoff with {'/'.join(map(str, self.handoff_procs))} processes, "
            f"throughput {self.throughput_resources} resources x "
            f"{self.throughput_procs} processes, "
            f"{self.big_resources:,} resources, {self.waiters:,} waiters / asyncio tasks"
        )


def make_plan(quick: bool, window_s: float | None = None) -> Plan:
    """The quick plan fits in a minute on 2 cores, the full one in ten."""
    if quick:
        plan = Plan(
            quick=True,
            uncontended_samples=2000,
            op_samples=1000,
            warmup_s=0.5,
            window_s=3.0,
            rounds=1,
            handoff_procs=(8,),
            throughput_procs=8,
            throughput_resources=2,
            hold_s=0.001,
            small_resources=10,
            big_resources=10_000,
            waiters=1_000,
        )
    else:
        plan = Plan(
            quick=False,
            uncontended_samples=10_000,
            op_samples=5_000,
            warmup_s=1.0,
            window_s=8.0,
            rounds=2,
            handoff_procs=(8, 32),
            throughput_procs=32,
            throughput_resources=8,
            hold_s=0.001,
            small_resources=10,
            big_resources=100_000,
            waiters=10_000,
        )
    if window_s is not None:
        plan = attrs.evolve(plan, window_s=window_s)
    return plan


# --- CLI -----------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser``."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer samples, 8 processes only, 10,000 resources and 1,000 waiters "
        "(under a minute); the default full run takes a few minutes",
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        help="use this Redis server (default: $REDIS_URL if set) instead of starting a "
        "private redis-server; "
        "keys go under a fresh prefix and are deleted afterwards. Memory and CPU "
        "figures are only meaningful on an otherwise idle server",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="write the results here (default: bench-<timestamp>.json in the current directory)",
    )
    parser.add_argument("--no-json", action="store_true", help="do not write a JSON file")
    parser.add_argument(
        "--only",
        metavar="LIST",
        type=_scenario_list,
        help=f"comma-separated scenarios to run, of: {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--window",
        metavar="SECONDS",
        type=positive_float,
        help="measuring window of each contended run (default 3 quick, 8 full)",
    )
    methods = multiprocessing.get_all_start_methods()
    parser.add_argument(
        "--start-method",
        choices=methods,
        default="fork" if "fork" in methods else "spawn",
        help="how worker processes are started (default: %(default)s)",
    )


def _scenario_list(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown scenario {', '.join(unknown) or '(none)'}; choose from {', '.join(SCENARIOS)}"
        )
    return names


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 if every target is met, 1 if one is missed, a
    scenario failed, or the benchmark could not start (no redis-server, a
    server down or refusing the login: one line, as every command says it)."""
    plan = make_plan(bool(args.quick), args.window)
    scenarios: Sequence[str] = args.only or SCENARIOS
    progress = Progress(sys.stderr, total=_step_count(plan, scenarios))
    started = time.time()
    server = None
    url: str = args.url or os.environ.get("REDIS_URL", "")
    if not url:
        from allocator._server import RedisServer

        try:
            server = RedisServer().start()
        except (OSError, RuntimeError) as exc:
            raise CommandError(f"bench: cannot start redis-server: {exc}") from None
        url = server.url
    try:
        try:
            bench = Bench(
                plan=plan,
                url=url,
                private=server is not None,
                ctx=multiprocessing.get_context(args.start_method),
                progress=progress,
            )
        except ValueError as exc:  # from_url
            raise CommandError(f"bad --url {safe_url(url)}: {exc}") from None
        except redis.RedisError as exc:
            raise CommandError(describe(exc, safe_url(url))) from None
        except BenchError as exc:
            raise CommandError(f"bench: {exc}") from None
        try:
            bench.run(scenarios)
        finally:
            bench.close()
    finally:
        if server is not None:
            server.close()
    finished = time.time()

    report = bench.report(started=started, finished=finished, version=_version(allocator))
    print(bench.header(args.start_method))
    print()
    print(format_table(bench.rows))
    print()
    print(bench.baseline_text())
    if bench.problems:
        print()
        print("problems:")
        for text in bench.problems:
            print("  - " + text.replace("\n", "\n    "))
    if not args.no_json:
        path = args.json or time.strftime("bench-%Y%m%d-%H%M%S.json", time.localtime(started))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, sort_keys=False)
            f.write("\n")
        print(f"\nwrote {path}")
    failed = any(row.passed is False for row in bench.rows) or bench.failed_scenarios
    return 1 if failed else 0


def _version(module: Any) -> str:
    return str(getattr(module, "__version__", "unknown"))


def _step_count(plan: Plan, scenarios: Iterable[str]) -> int:
    steps = 0
    for name in scenarios:
        if name == "handoff":
            steps += 2 * plan.rounds * len(plan.handoff_procs)
        elif name in ("throughput", "tenants"):
            steps += 2 * plan.rounds
        else:
            steps += 1
    return steps


# --- progress ---------------------------------------------------------------------


class Progress:
    """One status line on stderr: live (``\\r``) on a terminal, one line per step
    otherwise, so that logs stay short."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.total = total
        self.n = 0
        self.label = ""
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False
        self._t0 = time.monotonic()
        self._last = 0.0

    def begin(self, label: str) -> None:
        self.n += 1
        self.label = label
        self._t0 = time.monotonic()
        self._last = 0.0
        self.update("starting")

    def update(self, detail: str) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        self.stream.write(f"\r\x1b[K{self._head()} {detail}")
        self.stream.flush()

    def end(self, summary: str) -> None:
        line = f"{self._head()} {summary} ({time.monotonic() - self._t0:.1f} s)"
        self.stream.write(("\r\x1b[K" if self.tty else "") + line + "\n")
        self.stream.flush()

    def _head(self) -> str:
        return f"[{self.n}/{self.total}] {self.label}:"
