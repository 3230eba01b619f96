"""Pure arithmetic behind ``allocator bench``: no I/O, no clock, no Redis.

Everything the benchmark concludes goes through these functions, so they are
unit-tested on their own (``tests/test_bench_logic.py``): percentiles, FIFO
inversion counting, grants seen out of arrival order, Jain's fairness index,
handoff pairing, throughput windows, and the ratio/target verdicts printed in
the table.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import (
    Any,
    NamedTuple,
    TypeVar,
)

import attrs

__all__ = [
    "ArrivalOrder",
    "GrantSample",
    "Handoffs",
    "Row",
    "Summary",
    "Target",
    "count_inversions",
    "evaluate",
    "exclusivity_violations",
    "fifo_violations",
    "format_table",
    "format_value",
    "grant_order_mismatches",
    "grants_per_worker",
    "handoffs",
    "jain_index",
    "out_of_arrival_order",
    "parse_ticket",
    "percentile",
    "summarize",
    "throughput",
]

K = TypeVar("K")


class GrantSample(NamedTuple):
    """One grant as a worker saw it. Times are ``time.monotonic_ns()`` values.

    ``t_wait``: acquire called; ``t_acquired``: acquire returned;
    ``t_release``: release called; ``t_released``: release returned.
    ``token``, ``ticket`` and ``granted_at`` come from the ``Lease`` (0, "" and
    0.0 for the token-list baseline, which has none of them).
    """

    worker: int
    t_wait: int
    t_acquired: int
    t_release: int
    t_released: int
    resource: str
    token: int = 0
    ticket: str = ""
    granted_at: float = 0.0


# --- percentiles -----------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between ranks.

    Same definition as numpy's default (``method="linear"``): rank
    ``q/100 * (n-1)`` in the sorted values. The input need not be sorted.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"q must be within 0..100, got {q!r}")
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    frac = rank - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * frac)


@attrs.frozen
class Summary:
    """Distribution of one measured quantity."""

    count: int
    min: float
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def summarize(values: Sequence[float]) -> Summary | None:
    """Count, extremes, p50/p90/p99 and mean; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return Summary(
        count=len(ordered),
        min=float(ordered[0]),
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        max=float(ordered[-1]),
        mean=math.fsum(ordered) / len(ordered),
    )


# --- order -----------------------------------------------------------------


def parse_ticket(ticket: str) -> tuple[int, int]:
    """A stream id ``"ms-seq"`` as ``(ms, seq)``, the order Redis gives stream ids.

    Compared as strings, ``"1700000000000-10"`` would sort before ``"...-9"``.
    """
    ms, sep, seq = ticket.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"not a stream id: {ticket!r}")
    return int(ms), int(seq)


def count_inversions(keys: Sequence[K]) -> int:
    """Pairs ``i < j`` with ``keys[i] > keys[j]``; equal keys are not inverted.

    Merge sort, O(n log n): the FIFO check runs on tens of thousands of grants.
    """
    items: list[Any] = list(keys)
    total = 0
    width = 1
    n = len(items)
    while width < n:
        merged: list[Any] = []
        for lo in range(0, n, 2 * width):
            left = items[lo : lo + width]
            right = items[lo + width : lo + 2 * width]
            i = j = 0
            while i < len(left) and j < len(right):
                if right[j] < left[i]:
                    # right[j] jumps ahead of everything still in ``left``.
                    total += len(left) - i
                    merged.append(right[j])
                    j += 1
                else:
                    merged.append(left[i])
                    i += 1
            merged.extend(left[i:])
            merged.extend(right[j:])
        items = merged
        width *= 2
    return total


def fifo_violations(grants: Iterable[tuple[str, float]]) -> int:
    """FIFO violations among ``(ticket, granted_at)`` pairs of one pool.

    A violation is a pair where A's ticket is earlier than B's but B was granted
    before A while A was waiting. Grant order is ``(granted_at, ticket)``: one
    script's grants share ``granted_at`` and are made in queue order, so a tie
    on ``granted_at`` is never a violation. "While A was waiting" needs no
    separate test: a ticket is a stream id taken at enqueue, so A's earlier
    ticket means A was enqueued before B, hence before B's grant.
    """
    ordered = sorted((granted_at, parse_ticket(ticket)) for ticket, granted_at in grants)
    return count_inversions([ticket for _, ticket in ordered])


def grant_order_mismatches(grants: Iterable[tuple[int, str, float]]) -> int:
    """Pairs on which token order and ``(granted_at, ticket)`` order disagree.

    For one resource of capacity 1 the fencing token counts grants, so both
    orders must be the same; input is ``(token, ticket, granted_at)``.
    """
    ordered = sorted(
        (granted_at, parse_ticket(ticket), token) for token, ticket, granted_at in grants
    )
    return count_inversions([token for _, _, token in ordered])


class ArrivalOrder(NamedTuple):
    """What :func:`out_of_arrival_order` found in one run's grants."""

    grants: int
    #: Grants that a later arrival was served more than the threshold before.
    late: int
    #: The largest such lead over all grants, in ns; 0 when none was passed.
    worst_ns: int


def out_of_arrival_order(
    times: Iterable[tuple[int, int]], more_than_ns: int, start_ns: int, end_ns: int
) -> ArrivalOrder:
    """Grants seen out of arrival order, from ``(arrival, seen)`` pairs in ns.

    ``arrival``: the client started its acquire; ``seen``: the acquire
    returned. Grant g is seen out of order by ``d`` = the largest
    ``seen(g) - seen(h)`` over grants h that arrived strictly later than g
    and were seen before it: a later arrival was served ``d`` before it.
    Counts the grants with ``d > more_than_ns``; equal arrivals never pass
    each other. As seen by the clients, so scheduling delays count too.
    Only grants that arrived in ``[start, end)`` count, as g or as h: a
    worker's first acquire (before the window) sets up its client, and the
    order it reaches the server in is not the order it started in.

    O(n log n): sorted by arrival, then a sweep from the latest arrival back,
    keeping the earliest ``seen`` of the arrivals after the current one (the
    ``h`` that gives the largest ``d``).
    """
    if more_than_ns < 0:
        raise ValueError(f"more_than_ns must not be negative, got {more_than_ns!r}")
    # Sorted by (arrival, seen), swept backwards: among equal arrivals the
    # later seen comes first, so a grant meets its peers only as leads <= 0
    # and equal arrivals never pass each other without a separate test.
    ordered = sorted(t for t in times if start_ns <= t[0] < end_ns)
    late = worst = 0
    earliest_later: int | None = None  # min seen over the arrivals swept so far
    for _, seen in reversed(ordered):
        if earliest_later is None or seen < earliest_later:
            earliest_later = seen
            continue  # seen before everything after it: passed by nobody
        lead = seen - earliest_later
        if lead > worst:
            worst = lead
        if lead > more_than_ns:
            late += 1
    return ArrivalOrder(grants=len(ordered), late=late, worst_ns=worst)


def exclusivity_violations(samples: Iterable[GrantSample]) -> int:
    """Holds of one resource (capacity 1) that overlap as the clients saw them.

    The next holder's ``acquire`` may return before the previous holder's
    ``release`` does (both wait on the same server reply), but never before
    ``release`` was called.
    """
    by_resource: dict[str, list[GrantSample]] = {}
    for s in samples:
        by_resource.setdefault(s.resource, []).append(s)
    bad = 0
    for holds in by_resource.values():
        holds.sort(key=lambda s: s.t_acquired)
        for prev, nxt in itertools.pairwise(holds):
            if nxt.t_acquired < prev.t_release:
                bad += 1
    return bad


# --- fairness and rates ----------------------------------------------------


def jain_index(allocations: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 is equal shares,
    ``1/n`` is one taker of everything. All zeros count as equal (1.0)."""
    if not allocations:
        raise ValueError("Jain index of no allocations")
    if any(x < 0 for x in allocations):
        raise ValueError("allocations must not be negative")
    square_sum = math.fsum(x * x for x in allocations)
    if square_sum == 0:
        return 1.0
    total = math.fsum(allocations)
    return total * total / (len(allocations) * square_sum)


def grants_per_worker(
    samples: Iterable[GrantSample], workers: int, start_ns: int, end_ns: int
) -> list[int]:
    """Grants per worker ``0..workers-1`` whose acquire returned in ``[start, end)``;
    workers that got nothing count as 0."""
    counts: Counter[int] = Counter(s.worker for s in samples if start_ns <= s.t_acquired < end_ns)
    return [counts.get(w, 0) for w in range(workers)]


def throughput(samples: Iterable[GrantSample], start_ns: int, end_ns: int) -> float:
    """Grants per second whose acquire returned in ``[start, end)``."""
    if end_ns <= start_ns:
        raise ValueError("empty window")
    n = sum(1 for s in samples if start_ns <= s.t_acquired < end_ns)
    return n * 1e9 / (end_ns - start_ns)


@attrs.frozen
class Handoffs:
    """Gaps between one holder and the next on a single resource, in ns.

    ``from_call``: previous holder calls ``release`` -> next ``acquire`` returns.
    ``from_return``: previous ``release`` returns -> next ``acquire`` returns;
    both ends wait on the same server turn, so this one can be negative and is
    mostly scheduling noise; it is kept for reference.
    """

    from_call: list[int]
    from_return: list[int]


def handoffs(samples: Iterable[GrantSample], start_ns: int, end_ns: int) -> Handoffs:
    """Pair each grant of a capacity-1 resource with the next one.

    Only pairs where the next holder was already waiting when the previous one
    called ``release`` are handoffs (otherwise the gap is idle time), and only
    pairs that lie wholly in ``[start, end)``.
    """
    ordered = sorted(samples, key=lambda s: s.t_acquired)
    from_call: list[int] = []
    from_return: list[int] = []
    for prev, nxt in itertools.pairwise(ordered):
        if prev.t_acquired < start_ns or nxt.t_acquired >= end_ns:
            continue
        if nxt.t_wait > prev.t_release:
            continue
        from_call.append(nxt.t_acquired - prev.t_release)
        from_return.append(nxt.t_acquired - prev.t_released)
    return Handoffs(from_call=from_call, from_return=from_return)


# --- verdicts ----------------------------------------------------------------

_EPS = 1e-9


@attrs.frozen
class Target:
    """A bound on a figure: ``on`` is ``"ratio"`` (value / baseline) or ``"value"``."""

    op: str = attrs.field(validator=attrs.validators.in_(("<=", ">=")))
    bound: float
    on: str = attrs.field(default="ratio", validator=attrs.validators.in_(("ratio", "value")))
    unit: str = ""

    def describe(self) -> str:
        if self.on == "ratio":
            return f"{self.op} {self.bound:g}x"
        if self.unit:
            return f"{self.op} {format_value(self.bound, self.unit)}"
        return f"{self.op} {self.bound:g}"

    def holds(self, x: float) -> bool:
        # A relative epsilon so that a ratio landing exactly on the bound
        # (250 / 100 = 2.5) passes whatever the float rounding.
        slack = _EPS * max(1.0, abs(self.bound))
        if self.op == "<=":
            return x <= self.bound + slack
        return x >= self.bound - slack


def evaluate(
    value: float | None, baseline: float | None, target: Target | None
) -> tuple[float | None, bool | None]:
    """``(ratio, passed)`` for one row.

    ``ratio`` is value / baseline, None without a positive baseline. ``passed``
    is None when there is no target (a reported figure) and False when the
    figure could not be measured or its ratio not formed: a missing number
    must not read as a pass.
    """
    ratio: float | None = None
    if (
        value is not None
        and baseline is not None
        and baseline > 0
        and math.isfinite(value)
        and math.isfinite(baseline)
    ):
        ratio = value / baseline
    if target is None:
        return ratio, None
    x = ratio if target.on == "ratio" else value
    if x is None or not math.isfinite(x):
        return ratio, False
    return ratio, target.holds(x)


@attrs.frozen
class Row:
    """One line of the result table (and one entry of the JSON)."""

    key: str
    title: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: Target | None = None
    note: str = ""
    text: str = ""  # shown instead of ``value`` when set (e.g. "1000/1000")

    @property
    def ratio(self) -> float | None:
        return evaluate(self.value, self.baseline, self.target)[0]

    @property
    def passed(self) -> bool | None:
        return evaluate(self.value, self.baseline, self.target)[1]

    @property
    def verdict(self) -> str:
        passed = self.passed
        if passed is None:
            return "report" if self.value is not None else "n/a"
        return "pass" if passed else "FAIL"

    def as_dict(self) -> dict[str, Any]:
        target = self.target
        return {
            "key": self.key,
            "title": self.title,
            "value": self.value,
            "unit": self.unit,
            "text": self.text or format_value(self.value, self.unit),
            "baseline": self.baseline,
            "baseline_name": self.baseline_name,
            "ratio": self.ratio,
            "target": None
            if target is None
            else {
                "op": target.op,
                "bound": target.bound,
                "on": target.on,
                "text": target.describe(),
            },
            "passed": self.passed,
            "verdict": self.verdict,
            "note": self.note,
        }


# --- text --------------------------------------------------------------------


def format_value(value: float | None, unit: str) -> str:
    """Human form of a figure: ``ns`` become µs or ms, rates get a ``/s``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "ns":
        if abs(value) >= 1e6:
            return f"{value / 1e6:.2f} ms"
        return f"{value / 1e3:.1f} µs"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "B":
        return f"{value:,.0f} B"
    if unit == "index":
        return f"{value:.4f}"
    if unit == "s":
        return f"{value:.2f} s"
    if float(value).is_integer():
        return f"{int(value):,}" + (f" {unit}" if unit else "")
    return f"{value:.3g}" + (f" {unit}" if unit else "")


def format_table(rows: Sequence[Row]) -> str:
    """The result table: one row per figure, columns aligned, notes below."""
    header = ("#", "figure", "measured", "baseline", "ratio", "target", "result")
    lines: list[tuple[str, ...]] = [header]
    notes: list[str] = []
    for row in rows:
        baseline = ""
        if row.baseline is not None or row.baseline_name:
            baseline = format_value(row.baseline, row.unit)
            if row.baseline_name:
                baseline += f" ({row.baseline_name})"
        ratio = row.ratio
        lines.append(
            (
                row.key,
                row.title,
                row.text or format_value(row.value, row.unit),
                baseline,
                "" if ratio is None else f"{ratio:.2f}x",
                "" if row.target is None else row.target.describe(),
                row.verdict,
            )
        )
        if row.note:
            notes.append(f"  {row.key}: {row.note}")
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = {2, 3, 4}
    out = []
    for n, line in enumerate(lines):
        cells = [
            cell.rjust(widths[i]) if i in right and n else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    if notes:
        out.append("")
        out.append("notes:")
        out.extend(notes)
    return "\n".join(out)
