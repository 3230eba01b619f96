"""The examples and ``allocator demo`` run and show what they claim.

Each example runs as a script in a subprocess, the way a reader runs it, and
its printed result is checked: not only that it ran, but that the numbers it
reports are the right ones (no FIFO violation, the rate budget kept, the
bindings hit). The checking helpers inside the demo and the rate example are
tested on their own first, so that their printed verdicts can be trusted.

Every run happens twice: on the scripts' default, an in-process fakeredis,
and with ``--url`` on the suite's real Redis (skipped when there is none).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import redis

from allocator._values import Lease
from allocator.cli import demo as _demo

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_script(*argv: str, timeout: float = 60) -> str:
    """Run ``python -W error argv...`` from the repository root; return its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-W", "error", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stderr == "", proc.stderr
    return proc.stdout


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["fakeredis", "redis"])
def url_args(request: pytest.FixtureRequest) -> list[str]:
    """No arguments (the in-process default), or ``--url`` of the real server."""
    if request.param == "fakeredis":
        return []
    return ["--url", request.getfixturevalue("redis_url")]


def one(pattern: str, text: str) -> re.Match[str]:
    found = re.search(pattern, text, re.MULTILINE)
    assert found, f"no line matches {pattern!r} in:\n{text}"
    return found


# -- the demo's checks, on made-up leases ------------------------------------------------


def lease(ticket: str, granted_at: float, resource: str = "r", token: int = 1) -> Lease:
    return Lease(
        resource=resource,
        token=token,
        id="secret",
        ticket=ticket,
        expires_at=granted_at + 60,
        ttl=60.0,
        granted_at=granted_at,
        pool="p",
    )


def test_ticket_key_compares_stream_ids_as_numbers() -> None:
    # As strings "10-0" < "9-5"; as stream ids 9-5 came first.
    assert _demo.ticket_key("9-5") < _demo.ticket_key("10-0")
    assert _demo.ticket_key("10-2") < _demo.ticket_key("10-10")
    assert _demo.ticket_key("1700000000000-3") == (1700000000000, 3)


def test_fifo_violations_counts_grants_that_passed_an_earlier_arrival() -> None:
    in_order = [lease("1-0", 1.0), lease("1-1", 1.5), lease("2-0", 2.0)]
    assert _demo.fifo_violations(in_order) == 0
    assert _demo.fifo_violations([]) == 0
    # 3-0 was granted while 1-0 and 2-0, who arrived first, still waited: one
    # violation, the grant that jumped; the two served after it are in order.
    jumped = [lease("3-0", 1.0), lease("1-0", 2.0), lease("2-0", 3.0)]
    assert _demo.fifo_violations(jumped) == 1
    # Entirely reversed: every grant but the last passed someone.
    assert _demo.fifo_violations([lease(f"{9 - i}-0", float(i)) for i in range(5)]) == 4
    # Grants in one script run share a server time; the ticket orders them.
    assert _demo.fifo_violations([lease("5-1", 1.0), lease("5-0", 1.0)]) == 0
    # Numeric, not textual, comparison of tickets.
    assert _demo.fifo_violations([lease("9-0", 1.0), lease("10-0", 2.0)]) == 0


def test_fencing_violations_counts_tokens_that_did_not_rise() -> None:
    rising = [lease("1-0", 1.0, "a", 1), lease("2-0", 2.0, "b", 1), lease("3-0", 3.0, "a", 2)]
    assert _demo.fencing_violations(rising) == 0
    repeated = [lease("1-0", 1.0, "a", 4), lease("2-0", 2.0, "a", 4), lease("3-0", 3.0, "a", 3)]
    assert _demo.fencing_violations(repeated) == 2


# -- the demo ------------------------------------------------------------------------------


def demo_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="allocator demo")
    _demo.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_demo_grants_in_arrival_order(
    capsys: pytest.CaptureFixture[str], url_args: list[str]
) -> None:
    workers, resources, rounds = 6, 2, 3
    args = demo_args(
        *url_args, "--workers", str(workers), "--resources", str(resources), "--rounds", str(rounds)
    )
    assert _demo.run(args) == 0
    out = capsys.readouterr().out

    grants = re.findall(
        r"^  (w\d+)\s+got (res-\d+)\s+waited\s+[\d.]+ ms  token (\d+)  ticket (\d+-\d+)$", out, re.M
    )
    assert len(grants) == workers * rounds
    assert {w for w, _, _, _ in grants} == {f"w{i + 1}" for i in range(workers)}
    assert {r for _, r, _, _ in grants} <= {f"res-{i + 1}" for i in range(resources)}
    for w in {w for w, _, _, _ in grants}:
        assert sum(1 for g in grants if g[0] == w) == rounds
    assert len({t for _, _, _, t in grants}) == len(grants), "every request has its own ticket"

    one(rf"^{workers * rounds} grants in ", out)
    one(r"^  FIFO\s+0 violations .* OK$", out)
    one(r"^  fencing\s+0 violations .* OK$", out)
    one(r"^  safety\s+0 resources over capacity .* OK$", out)
    one(rf"^  no loss\s+leased 0, waiting 0, free {resources} of {resources}\s+OK$", out)
    one(r"^all checks passed$", out)
    for resource in {r for _, r, _, _ in grants}:
        tokens = [int(t) for _, r, t, _ in grants if r == resource]
        assert len(set(tokens)) == len(tokens), "each grant of a resource has its own token"
        row = one(rf"^  {resource}\s+(\d+) grants, at most (\d+) holder", out)
        assert int(row[1]) == len(tokens)
        assert int(row[2]) == 1
    if url_args:
        # The demo named its pool itself, so it deleted it afterwards.
        name = one(r"in pool '(demo-[0-9a-f]+)'", out)[1]
        with redis.Redis.from_url(url_args[1]) as client:
            assert client.keys(f"alloc:{{{name}}}:*") == []


def test_demo_with_shared_slots_and_quiet(
    capsys: pytest.CaptureFixture[str], url_args: list[str]
) -> None:
    args = demo_args(*url_args, "--workers", "5", "--resources", "1", "--capacity", "2", "--quiet")
    assert _demo.run(args) == 0
    out = capsys.readouterr().out
    assert " got " not in out
    one(r"^15 grants in ", out)
    one(
        r"^  res-1\s+15 grants, at most [12] holder\(s\) at once \(capacity 2\)$",
        out,
    )
    one(r"^  FIFO\s+0 violations", out)
    one(r"^all checks passed$", out)


def test_demo_without_fakeredis_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "fakeredis", None)  # makes `import fakeredis` fail
    monkeypatch.delenv("REDIS_URL", raising=False)  # else the demo runs on that server
    assert _demo.run(demo_args()) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "pip install 'fakeredis[lua]'" in captured.err
    assert "--url" in captured.err


def test_demo_rejects_bad_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--workers", "0"], ["--rounds", "-1"], ["--hold", "nan"]):
        with pytest.raises(SystemExit):
            demo_args(*argv)
    assert "must be" in capsys.readouterr().err


def test_demo_command_line() -> None:
    out = run_script("-m", "allocator", "demo", "--workers", "3", "--rounds", "2")
    one(r"^6 grants in ", out)
    one(r"^  FIFO\s+0 violations", out)
    one(r"^all checks passed$", out)


# -- the examples --------------------------------------------------------------------------


def test_basic(url_args: list[str], pool_name: str) -> None:
    out = run_script("examples/basic.py", *url_args, "--pool", pool_name)
    one(rf"^pool '{pool_name}': 2 proxies added$", out)
    one(r"^leased http://10\.0\.0\.[12]:3128 \(fencing token \d+\)$", out)
    one(r"^holding http://10\.0\.0\.[12]:3128 and http://10\.0\.0\.[12]:3128$", out)
    one(r"^non-blocking acquire while both are held: None$", out)
    one(r"^blocking acquire with timeout=0\.2: AcquireTimeout: ", out)
    one(r"^released: True, True$", out)
    one(r"^released again: False$", out)
    one(r"^status: 2 resources, 2 free, 0 leased, 0 waiting$", out)


def test_basic_async(url_args: list[str], pool_name: str) -> None:
    out = run_script("examples/basic_async.py", *url_args, "--pool", pool_name)
    one(rf"^pool '{pool_name}': 2 proxies added$", out)
    jobs = re.findall(r"^job (\d): got (\S+) \(fencing token \d+\)$", out, re.M)
    assert sorted(n for n, _ in jobs) == ["0", "1", "2", "3", "4"]
    assert {p for _, p in jobs} == {"http://10.0.0.1:3128", "http://10.0.0.2:3128"}
    one(r"^served in arrival order: yes$", out)
    one(r"^status: 2 resources, 2 free, 0 leased, 0 waiting$", out)


def test_proxy_pool_quarantines_the_broken_proxy(url_args: list[str]) -> None:
    out = run_script("examples/proxy_pool.py", *url_args, "--pages", "30")
    one(r"^fetched 30 of 30 pages in ", out)
    rows = re.findall(r"^  (proxy-\d)\s+(\d+) pages\s+(\d+) failures(  \(broken\))?$", out, re.M)
    assert len(rows) == 3
    broken = [r for r in rows if r[3]]
    good = [r for r in rows if not r[3]]
    assert len(broken) == 1
    name, pages, failures, _ = broken[0]
    assert int(pages) == 0
    assert int(failures) >= 1
    assert sum(int(p) for _, p, _, _ in good) == 30
    assert all(int(f) == 0 for _, _, f, _ in good)
    events = re.findall(
        rf"^  \+\s*[\d.]+ s  {name} failed \(502 Bad Gateway\) on /page/\d+: "
        r"quarantined for 0\.25 s, status says 'quarantined'$",
        out,
        re.M,
    )
    assert len(events) == int(failures)


def test_worker_affinity_hits_the_bound_resource(url_args: list[str]) -> None:
    out = run_script(
        "examples/worker_affinity.py", *url_args, "--workers", "4", "--gpus", "4", "--jobs", "10"
    )
    one(r"^without bind:\s+\d+ cold loads in 40 jobs$", out)
    cold = int(one(r"^with bind:\s+(\d+) cold loads in 40 jobs$", out)[1])
    assert cold <= 8
    here = one(r"^binding hit ratio, counted here: ([\d.]+) \((\d+) hits, (\d+) misses\)$", out)
    assert int(here[2]) + int(here[3]) == 36  # every job but each worker's first
    assert float(here[1]) >= 0.9
    pool = one(r"^binding hit ratio, pool\.status\(\): ([\d.]+) \((\d+) hits, (\d+) misses", out)
    assert float(pool[1]) >= 0.8
    assert int(pool[2]) >= int(here[2])


def test_rate_limited_api_keeps_the_budget(url_args: list[str]) -> None:
    out = run_script(
        "examples/rate_limited_api.py",
        *url_args,
        "--budget",
        "10",
        "--window",
        "0.5",
        "--calls",
        "25",
    )
    one(r"^25 calls by 8 clients", out)
    windows = [int(n) for n in re.findall(r"^  window .*:\s+(\d+) calls$", out, re.M)]
    assert sum(windows) == 25
    assert max(windows) <= 10
    rate = float(one(r"^achieved rate: ([\d.]+) calls/s over \d+ whole window", out)[1])
    assert rate <= 20.0  # 10 calls per 0.5 s
    busiest = int(one(r"^busiest 0\.5 s sliding window: (\d+) calls \(budget 10\) OK$", out)[1])
    assert busiest <= 10


def test_rate_limited_api_window_arithmetic() -> None:
    api = load_example("rate_limited_api")
    assert api.busiest_window([], 1.0) == 0
    assert api.busiest_window([0.0, 1.0, 2.0], 1.0) == 1  # windows are half-open
    assert api.busiest_window([0.0, 0.5, 0.999999, 1.0], 1.0) == 3
    assert api.busiest_window([5.0, 5.0, 5.0, 1.0], 1.0) == 3
    assert api.busiest_window([0.1, 0.2, 0.3], 0.2) == 2  # no float rounding at the edges
    assert api.per_window([0.0, 0.2, 1.0, 2.5], 1.0) == [2, 1, 1]
    assert api.per_window([3.0], 1.0) == [1]


def test_gpus_serves_two_card_and_one_card_jobs_in_arrival_order(url_args: list[str]) -> None:
    out = run_script("examples/gpus.py", *url_args, "--gpus", "3", "--jobs", "10")
    needs = [int(n) for n in one(r"^  ([12](?: [12])*)$", out)[1].split()]
    assert len(needs) == 10 and {1, 2} <= set(needs)
    rows = re.findall(r"^  job\s+(\d+) \(([12]) cards?\s*\)  got ((?:gpu-\d ?)+)\s+at ", out, re.M)
    assert len(rows) == 10
    for number, cards, names in rows:
        got = names.split()
        assert len(got) == int(cards) == needs[int(number) - 1]
        assert len(set(got)) == len(got)
    one(r"^served in arrival order: yes$", out)
    one(r"^every job got all its cards at once: yes$", out)
    one(r"^a card used by two jobs at once: 0 times$", out)
    one(r"^status: 3 resources, 3 free, 0 leased, 0 waiting$", out)
