"""The benchmark's arithmetic, without Redis: what ``allocator bench`` concludes
is only as good as these functions, so each test here is chosen to fail on a
plausible wrong implementation (string-sorted tickets, ties counted as
inversions, an off-by-one percentile rank, a ratio taken the wrong way round).
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections.abc import Sequence

import pytest

from allocator.cli.bench.stats import (
    GrantSample,
    Row,
    Target,
    count_inversions,
    evaluate,
    exclusivity_violations,
    fifo_violations,
    format_table,
    format_value,
    grant_order_mismatches,
    grants_per_worker,
    handoffs,
    jain_index,
    out_of_arrival_order,
    parse_ticket,
    percentile,
    summarize,
    throughput,
)


def brute_inversions(keys: Sequence[object]) -> int:
    return sum(1 for i, j in itertools.combinations(range(len(keys)), 2) if keys[i] > keys[j])  # type: ignore[operator]


def brute_arrival_order(times: Sequence[tuple[int, int]], more_than_ns: int) -> tuple[int, int]:
    """The definition, grant by grant: the largest lead of a strictly later
    arrival seen before it; ``(grants with lead > more_than_ns, worst lead)``."""
    leads = [
        max((sg - sh for ah, sh in times if ah > ag and sh < sg), default=0) for ag, sg in times
    ]
    return sum(1 for d in leads if d > more_than_ns), max(leads, default=0)


def brute_fifo(grants: Sequence[tuple[str, float]]) -> int:
    """The definition, pair by pair: A enqueued first (earlier ticket), B granted
    first (earlier ``(granted_at, ticket)``), and A already waiting at B's grant."""
    bad = 0
    for (ta, ga), (tb, gb) in itertools.permutations(grants, 2):
        ka, kb = parse_ticket(ta), parse_ticket(tb)
        a_waiting_at_b_grant = ka[0] / 1000.0 <= gb
        if ka < kb and (gb, kb) < (ga, ka) and a_waiting_at_b_grant:
            bad += 1
    return bad


# --- percentiles ---------------------------------------------------------------


def test_percentile_matches_linear_interpolation() -> None:
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    # rank 0.5 * 3 = 1.5: halfway between 20 and 30 (a nearest-rank p50 gives 20 or 30)
    assert percentile(values, 50) == 25.0
    # rank 0.99 * 3 = 2.97
    assert percentile(values, 99) == pytest.approx(39.7)


def test_percentile_sorts_its_input() -> None:
    assert percentile([40.0, 10.0, 30.0, 20.0], 50) == 25.0
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0


def test_percentile_of_one_value_and_errors() -> None:
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


def test_p99_is_not_the_maximum() -> None:
    values = [float(v) for v in range(1, 201)]  # 1..200
    assert percentile(values, 99) == pytest.approx(198.01)
    assert percentile(values, 99) < max(values)


def test_summarize() -> None:
    s = summarize([3.0, 1.0, 2.0])
    assert s is not None
    assert (s.count, s.min, s.p50, s.max, s.mean) == (3, 1.0, 2.0, 3.0, 2.0)
    assert summarize([]) is None


# --- tickets and inversions ------------------------------------------------------


def test_parse_ticket_compares_numerically() -> None:
    assert parse_ticket("1700000000000-9") < parse_ticket("1700000000000-10")
    assert parse_ticket("999-5") < parse_ticket("1000-0")
    # the string order is the wrong one in both cases
    assert "1700000000000-10" < "1700000000000-9"
    assert "1000-0" < "999-5"


@pytest.mark.parametrize("bad", ["", "123", "a-1", "1-", "-1", "1-2-3"])
def test_parse_ticket_rejects_non_ids(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_ticket(bad)


def test_count_inversions_small_cases() -> None:
    assert count_inversions([]) == 0
    assert count_inversions([1]) == 0
    assert count_inversions([1, 2, 3, 4, 5]) == 0
    assert count_inversions([2, 1]) == 1
    assert count_inversions([1, 3, 2, 4]) == 1
    assert count_inversions([5, 4, 3, 2, 1]) == 10
    # ties are not inversions
    assert count_inversions([1, 1, 1]) == 0
    assert count_inversions([2, 1, 1]) == 2


def test_count_inversions_matches_brute_force() -> None:
    rng = random.Random(5)
    for n in [2, 3, 7, 16, 33, 100]:
        for _ in range(20):
            keys = [rng.randrange(n // 2 + 1) for _ in range(n)]
            assert count_inversions(keys) == brute_inversions(keys)


def test_count_inversions_does_not_mutate() -> None:
    keys = [3, 1, 2]
    count_inversions(keys)
    assert keys == [3, 1, 2]


# --- FIFO ------------------------------------------------------------------------


def test_fifo_in_order_is_zero() -> None:
    grants = [(f"1000-{i}", 1.0 + i / 1000) for i in range(50)]
    assert fifo_violations(grants) == 0


def test_fifo_does_not_depend_on_input_order() -> None:
    # An implementation that trusts the order of its input (already "sorted")
    # would see inversions here, or miss them in the next test.
    grants = [(f"1000-{i}", 1.0 + i / 1000) for i in range(50)]
    random.Random(1).shuffle(grants)
    assert fifo_violations(grants) == 0


def test_fifo_one_inversion() -> None:
    grants = [("1000-0", 1.000), ("1000-1", 1.002), ("1000-2", 1.001), ("1000-3", 1.003)]
    assert fifo_violations(grants) == 1
    random.Random(2).shuffle(grants)
    assert fifo_violations(grants) == 1


def test_fifo_one_late_grant_counts_every_passer() -> None:
    # ticket 0 is served last: everybody behind it passed it.
    grants = [("1000-0", 2.0)] + [(f"1000-{i}", 1.0 + i / 100) for i in range(1, 6)]
    assert fifo_violations(grants) == 5


def test_fifo_ties_on_granted_at_follow_ticket_order() -> None:
    # One script granted three waiters at once: same granted_at, queue order.
    grants = [("1000-2", 5.0), ("1000-0", 5.0), ("1000-1", 5.0), ("1000-3", 5.5)]
    assert fifo_violations(grants) == 0


def test_fifo_ticket_seq_compared_as_numbers() -> None:
    # Same millisecond: seq 9 came before seq 10. As strings "10" < "9".
    grants = [("1700000000000-9", 1.0), ("1700000000000-10", 2.0)]
    assert fifo_violations(grants) == 0
    grants = [("1700000000000-9", 2.0), ("1700000000000-10", 1.0)]
    assert fifo_violations(grants) == 1


def test_fifo_ticket_ms_compared_as_numbers() -> None:
    grants = [("999-0", 1.0), ("1000-0", 2.0)]
    assert fifo_violations(grants) == 0


def test_fifo_matches_the_pairwise_definition() -> None:
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randrange(2, 25)
        # enqueue times in ms; grants after enqueue, with coarse times to force ties
        tickets = sorted((rng.randrange(1000, 1010), rng.randrange(0, 12)) for _ in range(n))
        tickets = sorted(set(tickets))
        grants = [
            (f"{ms}-{seq}", (ms + rng.randrange(0, 4)) / 1000.0 + 0.0001) for ms, seq in tickets
        ]
        assert fifo_violations(grants) == brute_fifo(grants)


def test_grant_order_mismatches() -> None:
    ok = [(1, "1000-0", 1.0), (2, "1000-1", 1.1), (3, "1000-2", 1.1)]
    assert grant_order_mismatches(ok) == 0
    bad = [(2, "1000-0", 1.0), (1, "1000-1", 1.1), (3, "1000-2", 1.2)]
    assert grant_order_mismatches(bad) == 1


# --- grants seen out of arrival order ------------------------------------------

MS = 1_000_000
EVER = (-(2**62), 2**62)  # a window that holds every arrival


def test_arrival_order_in_order_is_zero() -> None:
    times = [(i * MS, i * MS + 3 * MS) for i in range(50)]
    random.Random(5).shuffle(times)
    assert out_of_arrival_order(times, 5 * MS, *EVER) == (50, 0, 0)
    assert out_of_arrival_order([], 5 * MS, *EVER) == (0, 0, 0)


def test_arrival_order_later_arrival_6_ms_earlier_counts() -> None:
    # g arrived first and was seen at 10 ms; h arrived after it, seen at 4 ms.
    times = [(0, 10 * MS), (1, 4 * MS)]
    assert out_of_arrival_order(times, 5 * MS, *EVER) == (2, 1, 6 * MS)


def test_arrival_order_4_ms_is_reported_not_counted() -> None:
    times = [(0, 10 * MS), (1, 6 * MS)]
    assert out_of_arrival_order(times, 5 * MS, *EVER) == (2, 0, 4 * MS)
    # "more than": exactly the threshold does not count either
    assert out_of_arrival_order([(0, 10 * MS), (1, 5 * MS)], 5 * MS, *EVER).late == 0
    assert out_of_arrival_order([(0, 10 * MS), (1, 5 * MS - 1)], 5 * MS, *EVER).late == 1


def test_arrival_order_equal_arrivals_never_pass_each_other() -> None:
    assert out_of_arrival_order([(7, 20 * MS), (7, 3 * MS)], 5 * MS, *EVER) == (2, 0, 0)
    # Among equal arrivals the late one is judged by later arrivals only:
    # (0, 20) is passed by (1, 10) by 10 ms, not by its peer (0, 3) by 17 ms.
    times = [(0, 20 * MS), (0, 3 * MS), (1, 10 * MS)]
    assert out_of_arrival_order(times, 5 * MS, *EVER) == (3, 1, 10 * MS)
    # ...and both peers are judged against the later one.
    times = [(0, 10 * MS), (0, 20 * MS), (1, 3 * MS)]
    assert out_of_arrival_order(times, 5 * MS, *EVER) == (3, 2, 17 * MS)


def test_arrival_order_takes_the_earliest_seen_later_arrival() -> None:
    # The next arrival passed g by 3 ms only, the one after it by 8 ms: g
    # counts (comparing with the next arrival alone would miss it); the middle
    # one is passed by exactly 5 ms, which does not.
    times = [(0, 20 * MS), (1, 17 * MS), (2, 12 * MS)]
    assert out_of_arrival_order(times, 5 * MS, *EVER) == (3, 1, 8 * MS)


def test_arrival_order_counts_grants_not_pairs() -> None:
    # One grant passed by five later arrivals is one grant out of order.
    times = [(0, 100 * MS)] + [(i, i * MS) for i in range(1, 6)]
    assert out_of_arrival_order(times, 5 * MS, *EVER) == (6, 1, 99 * MS)


def test_arrival_order_counts_arrivals_in_the_window_only() -> None:
    # The grant that arrived at 10 ms is passed by the one that arrived at 20.
    times = [(10 * MS, 30 * MS), (20 * MS, 12 * MS), (30 * MS, 31 * MS), (40 * MS, 32 * MS)]
    assert out_of_arrival_order(times, 5 * MS, *EVER) == (4, 1, 18 * MS)
    # The passed grant outside the window, then its passer outside it.
    assert out_of_arrival_order(times, 5 * MS, 11 * MS, 100 * MS) == (3, 0, 0)
    assert out_of_arrival_order(times, 5 * MS, 0, 20 * MS) == (1, 0, 0)
    # [start, end): an arrival at start is in, one at end is out
    assert out_of_arrival_order(times, 5 * MS, 10 * MS, 21 * MS) == (2, 1, 18 * MS)
    assert out_of_arrival_order(times, 5 * MS, 10 * MS, 20 * MS) == (1, 0, 0)


def test_arrival_order_row_adds_runs_up_within_their_windows() -> None:
    from types import SimpleNamespace

    from allocator.cli.bench.base import RunResult
    from allocator.cli.bench.contended import Contended

    def run(kind: str, window: tuple[int, int], times: list[tuple[int, int]]) -> RunResult:
        samples = [sample(0, a, s, s + 1, s + 2) for a, s in times]
        return RunResult(kind, 8, 1, samples, window, [], 0.0)

    # Run 1: a grant passed by 6 ms in the window, one passed by 40 ms before it.
    early = [(0, 50 * MS), (1, 10 * MS)]
    lib1 = run(
        "library", (100 * MS, 200 * MS), [*early, (100 * MS, 116 * MS), (101 * MS, 110 * MS)]
    )
    # Run 2 (another clock origin): one passed by 9 ms, one by 4 ms.
    lib2 = run("library", (0, 100 * MS), [(0, 19 * MS), (1, 10 * MS), (2, 30 * MS), (3, 26 * MS)])
    tok = run("tokens", (0, 100 * MS), [(0, 30 * MS), (1, 10 * MS)])
    bench = SimpleNamespace(library_runs=[lib1, lib2], token_runs=[tok], details={}, rows=[])
    bench.add = bench.rows.append
    Contended._arrival_order_row(bench)  # type: ignore[arg-type]
    row, tight = bench.rows
    assert (row.key, row.value, row.baseline) == ("3c", 2.0, 1.0)
    # 3d: by more than 1 ms, the 4 ms lead counts too.
    assert (tight.key, tight.value, tight.baseline) == ("3d", 3.0, 1.0)
    assert tight.text == "3 in 6 grants" and tight.passed is False
    assert bench.details["arrival_order_tight"]["library"]["more_than_ns"] == MS
    assert row.text == "2 in 6 grants, worst 9.00 ms"
    assert row.baseline_name == "token list, worst 20.00 ms"
    assert row.passed is False
    lib = bench.details["arrival_order"]["library"]
    assert lib == {"more_than_ns": 5 * MS, "grants": 6, "late": 2, "worst_ns": 9 * MS}
    # in order: the row passes
    in_order = run("library", (0, 100 * MS), [(0, 1), (1, 2)])
    bench = SimpleNamespace(library_runs=[in_order], token_runs=[], details={}, rows=[])
    bench.add = bench.rows.append
    Contended._arrival_order_row(bench)  # type: ignore[arg-type]
    assert bench.rows[0].passed is True and bench.rows[1].passed is True
    assert bench.rows[0].baseline is None and bench.rows[1].baseline is None


def test_arrival_order_rejects_a_negative_threshold() -> None:
    with pytest.raises(ValueError):
        out_of_arrival_order([(0, 1)], -1, *EVER)


def test_arrival_order_matches_the_definition() -> None:
    rng = random.Random(6)
    for _ in range(300):
        n = rng.randrange(0, 30)
        # coarse arrivals to force ties; seen some time after arrival
        times = []
        for _ in range(n):
            arrival = rng.randrange(0, 10) * MS
            times.append((arrival, arrival + rng.randrange(0, 15) * MS + rng.randrange(0, 3)))
        for threshold in (0, 5 * MS, 9 * MS):
            got = out_of_arrival_order(times, threshold, *EVER)
            assert (got.late, got.worst_ns) == brute_arrival_order(times, threshold)
            assert got.grants == n


# --- Jain -------------------------------------------------------------------------


def test_jain_index() -> None:
    assert jain_index([5, 5, 5, 5]) == 1.0
    assert jain_index([1, 0, 0, 0]) == 0.25  # one taker: 1/n
    assert jain_index([2, 1]) == pytest.approx(0.9)  # 9 / (2 * 5)
    assert jain_index([0, 0]) == 1.0
    # scale-free
    assert jain_index([200, 100]) == pytest.approx(jain_index([2, 1]))


def test_jain_index_counts_starved_workers() -> None:
    # A worker with no grant must be in the input, not dropped.
    assert jain_index([10, 10, 10, 0]) == pytest.approx(0.75)
    assert jain_index([10, 10, 10]) == 1.0


def test_jain_index_errors() -> None:
    with pytest.raises(ValueError):
        jain_index([])
    with pytest.raises(ValueError):
        jain_index([1, -1])


def test_jain_near_threshold() -> None:
    # 8 workers, one 20% short: 780^2 / (8 * 76400) still passes 0.99;
    # one 40% short: 760^2 / (8 * 73600) does not.
    assert jain_index([100] * 7 + [80]) == pytest.approx(608400 / 611200)
    assert jain_index([100] * 7 + [80]) > 0.99
    assert jain_index([100] * 7 + [60]) == pytest.approx(577600 / 588800)
    assert jain_index([100] * 7 + [60]) < 0.99


# --- samples: handoffs, rates, exclusivity --------------------------------------


def sample(
    worker: int, wait: int, acq: int, rel: int, reld: int, resource: str = "r0"
) -> GrantSample:
    return GrantSample(worker, wait, acq, rel, reld, resource)


def test_handoffs_pairs_by_acquire_time() -> None:
    samples = [
        sample(1, 0, 1_000, 2_000, 2_100),
        sample(2, 500, 2_050, 3_000, 3_200),  # waited before 2_000: a handoff of 50
        sample(1, 2_200, 3_150, 4_000, 4_100),  # waited before 3_000: 150 from call
    ]
    random.Random(4).shuffle(samples)
    gaps = handoffs(samples, 0, 10_000)
    assert gaps.from_call == [50, 150]
    assert gaps.from_return == [-50, -50]


def test_handoffs_skip_idle_gaps_and_window() -> None:
    samples = [
        sample(1, 0, 1_000, 2_000, 2_100),
        sample(2, 2_500, 2_600, 3_000, 3_100),  # came after the release: idle, no handoff
        sample(1, 2_800, 3_100, 4_000, 4_100),
        sample(2, 3_500, 4_200, 5_000, 5_100),
    ]
    assert handoffs(samples, 0, 10_000).from_call == [100, 200]
    # window [3_000, 4_200): only the pair starting at 3_100 and ending before 4_200
    assert handoffs(samples, 3_000, 4_200).from_call == []
    assert handoffs(samples, 3_000, 4_201).from_call == [200]


def test_throughput_and_grants_per_worker() -> None:
    samples = [sample(w, 0, t, t + 1, t + 2) for w, t in [(0, 10), (1, 20), (0, 30), (2, 99)]]
    assert throughput(samples, 0, 1_000_000_000) == 4.0
    assert throughput(samples, 10, 30) == pytest.approx(2 * 1e9 / 20)  # [10, 30): 10 and 20
    assert grants_per_worker(samples, 4, 0, 100) == [2, 1, 1, 0]
    with pytest.raises(ValueError):
        throughput(samples, 5, 5)


def test_exclusivity_violations() -> None:
    ok = [sample(1, 0, 10, 20, 30), sample(2, 0, 25, 40, 50), sample(3, 0, 10, 40, 50, "r1")]
    assert exclusivity_violations(ok) == 0
    # acquire returned before the previous holder even called release
    bad = [sample(1, 0, 10, 20, 30), sample(2, 0, 15, 40, 50)]
    assert exclusivity_violations(bad) == 1


# --- verdicts ------------------------------------------------------------------------


def test_ratio_is_value_over_baseline() -> None:
    ratio, passed = evaluate(250.0, 100.0, Target("<=", 2.5))
    assert ratio == 2.5
    assert passed is True  # the bound itself passes


def test_ratio_above_bound_fails() -> None:
    ratio, passed = evaluate(251.0, 100.0, Target("<=", 2.5))
    assert ratio == pytest.approx(2.51)
    assert passed is False


def test_at_least_targets() -> None:
    assert evaluate(900.0, 1000.0, Target(">=", 0.9)) == (0.9, True)
    assert evaluate(899.0, 1000.0, Target(">=", 0.9))[1] is False
    # better than baseline: passes, and is not confused with an upper bound
    assert evaluate(2000.0, 1000.0, Target(">=", 0.9))[1] is True
    assert evaluate(2000.0, 1000.0, Target("<=", 1.5))[1] is False


def test_value_targets_ignore_baseline() -> None:
    assert evaluate(0.995, 0.5, Target(">=", 0.99, on="value")) == (pytest.approx(1.99), True)
    assert evaluate(0.0, None, Target("<=", 0, on="value")) == (None, True)
    assert evaluate(1.0, None, Target("<=", 0, on="value")) == (None, False)
    assert evaluate(300.0, None, Target("<=", 300, on="value")) == (None, True)
    assert evaluate(301.0, None, Target("<=", 300, on="value"))[1] is False


def test_missing_numbers_never_pass() -> None:
    assert evaluate(None, 100.0, Target("<=", 2.5)) == (None, False)
    assert evaluate(100.0, None, Target("<=", 2.5)) == (None, False)
    assert evaluate(100.0, 0.0, Target("<=", 2.5)) == (None, False)
    assert evaluate(float("nan"), 1.0, Target("<=", 2.5)) == (None, False)
    assert evaluate(None, None, Target("<=", 0, on="value")) == (None, False)


def test_reported_figures_have_no_verdict() -> None:
    assert evaluate(5.0, 2.0, None) == (2.5, None)
    row = Row("8", "cpu", 5.0, "ns", 2.0, "token list")
    assert row.verdict == "report"
    assert Row("8", "cpu", None, "ns").verdict == "n/a"


def test_target_validation_and_text() -> None:
    with pytest.raises(ValueError):
        Target("<", 1.0)
    with pytest.raises(ValueError):
        Target("<=", 1.0, on="percent")
    assert Target("<=", 2.5).describe() == "<= 2.5x"
    assert Target(">=", 0.99, on="value").describe() == ">= 0.99"
    assert Target("<=", 300, on="value", unit="B").describe() == "<= 300 B"


def test_row_verdicts() -> None:
    passing = Row("1", "cycle", 120_000.0, "ns", 60_000.0, "PING p50", Target("<=", 2.5))
    failing = Row("1", "cycle", 160_000.0, "ns", 60_000.0, "PING p50", Target("<=", 2.5))
    assert (passing.ratio, passing.passed, passing.verdict) == (2.0, True, "pass")
    assert failing.verdict == "FAIL"
    d = failing.as_dict()
    assert d["ratio"] == pytest.approx(2.6667, abs=1e-4)
    assert d["passed"] is False
    assert d["target"]["text"] == "<= 2.5x"


# --- text ------------------------------------------------------------------------------


def test_format_value() -> None:
    assert format_value(61_234.0, "ns") == "61.2 µs"
    assert format_value(1_500_000.0, "ns") == "1.50 ms"
    assert format_value(4321.4, "/s") == "4,321/s"
    assert format_value(123.6, "B") == "124 B"
    assert format_value(0.99123, "index") == "0.9912"
    assert format_value(3.0, "") == "3"
    assert format_value(None, "ns") == "-"


def test_format_table_lists_every_row_and_note() -> None:
    rows = [
        Row("1", "cycle p50", 120_000.0, "ns", 60_000.0, "PING p50", Target("<=", 2.5)),
        Row("3a", "FIFO", 0.0, "", target=Target("<=", 0, on="value"), text="0 in 9 grants"),
        Row("8", "cpu", 5_000.0, "ns", 2_500.0, "token list", note="reported only"),
    ]
    table = format_table(rows)
    lines = table.splitlines()
    assert lines[0].split() == ["#", "figure", "measured", "baseline", "ratio", "target", "result"]
    assert "2.00x" in lines[2] and lines[2].rstrip().endswith("pass")
    assert "0 in 9 grants" in lines[3]
    assert lines[4].rstrip().endswith("report")
    assert "8: reported only" in table


# --- CLI options (no Redis involved) -------------------------------------------------


def test_add_arguments_parses_options() -> None:
    from allocator.cli import bench as _bench

    parser = argparse.ArgumentParser()
    _bench.add_arguments(parser)
    args = parser.parse_args(["--quick", "--json", "out.json", "--only", "handoff,large"])
    assert args.quick is True
    assert args.json == "out.json"
    assert args.only == ("handoff", "large")
    assert args.url is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--only", "nope"])


def test_plans_scale() -> None:
    from allocator.cli.bench import make_plan

    quick, full = make_plan(True), make_plan(False)
    assert quick.handoff_procs == (8,) and quick.throughput_procs == 8
    assert full.handoff_procs == (8, 32) and full.throughput_procs == 32
    assert (full.big_resources, full.waiters) == (100_000, 10_000)
    assert (quick.big_resources, quick.waiters) == (10_000, 1_000)
    assert make_plan(True, 1.5).window_s == 1.5
