"""The ``allocator`` command, in-process (``main(argv) -> int``) against a
real server, a Redis Cluster, a read-only user, a server that is down, a
refused password; the metrics endpoint scraped over HTTP; a closed pipe."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import Background, wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from allocator import FairAllocator, LeaseLost
from allocator.cli import main
from allocator.metrics import AllocatorCollector

pytestmark = pytest.mark.real_redis

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """REDIS_URL and ALLOCATOR_PREFIX set for the commands; a fresh prefix."""
    prefix = f"cli{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ALLOCATOR_PREFIX", prefix)
    yield redis_url, prefix


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def no_traceback(err: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_version_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("allocator 0.")
    code, _, err = run(capsys)
    assert code == 2 and "usage" in err
    code, _, err = run(capsys, "gc", "p", "--every", "0")
    assert code == 2 and "> 0" in err


def test_without_the_extra_one_line_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a)
    )
    code, out, err = run(capsys, "status", "x")
    assert code == 1 and out == ""
    no_traceback(err)
    assert "redis-fair-allocator[cli]" in err


def test_extend_status_pools_and_json(
    env: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, prefix = env
    code, out, _ = run(capsys, "extend", "web", "p1", "p2", "--capacity", "2", "--rate", "5/1")
    assert code == 0 and "2 added" in out
    pool = FairAllocator(redis.Redis.from_url(url), "web", prefix=prefix)
    held = pool.acquire(timeout=5, owner="crawler-7")
    code, out, _ = run(capsys, "status", "web")
    assert code == 0
    assert "crawler-7" in out and "p1" in out and "5 / 1 s" in out
    assert "grants" in out and "expires in" in out
    code, out, _ = run(capsys, "status", "web", "--json")
    data = json.loads(out)
    assert data["size"] == 2 and data["leased"] == 1
    assert data["leases"][0]["owner"] == "crawler-7"
    assert data["leases"][0]["token"] == held.token
    assert data["leases"][0]["expires_at_iso"].endswith("+00:00")
    assert data["stats"]["grants"] == 1
    assert data["resources"][0]["rate"] == {"count": 5, "seconds": 1.0}
    code, out, _ = run(capsys, "pools", "--json")
    assert code == 0
    assert json.loads(out) == [
        {
            "pool": "web",
            "size": 2,
            "free": 2,
            "slots": 4,
            "free_slots": 3,
            "leased": 1,
            "waiting": 0,
            "oldest_wait_seconds": 0,
        }
    ]
    code, out, _ = run(capsys, "pools")
    assert "web" in out and "oldest wait" in out
    # One unit a column: resources, slots, leases.
    header = next(line for line in out.splitlines() if "pool" in line and "waiting" in line)
    assert [c.strip() for c in header.strip("┃│ ").split("┃")] == [
        "pool", "resources", "slots", "free slots", "leases", "waiting", "oldest wait"
    ]  # fmt: skip


def test_status_filters(env: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    url, prefix = env
    pool = FairAllocator(redis.Redis.from_url(url), "f", prefix=prefix)
    pool.extend(["a", "b", "c"])
    first = pool.acquire(timeout=5, owner="job-1")
    second = pool.acquire(timeout=5, owner="job-2")
    idle = ({"a", "b", "c"} - {first.resource, second.resource}).pop()
    pool.quarantine(idle, 60)

    def shown(*argv: str) -> tuple[list[str], list[str]]:
        code, out, _ = run(capsys, "status", "f", "--json", *argv)
        assert code == 0
        data = json.loads(out)
        assert data["size"] == 3  # the pool-wide figures stay whole
        return [r["name"] for r in data["resources"]], [i["owner"] for i in data["leases"]]

    assert shown("--resource", first.resource) == ([first.resource], ["job-1"])
    assert shown("--state", "quarantined") == ([idle], [])
    assert shown("--state", "leased") == (
        sorted([first.resource, second.resource]),
        ["job-1", "job-2"],
    )
    assert shown("--owner", "job-2") == ([second.resource], ["job-2"])
    assert shown("--owner", "nobody") == ([], [])
    assert shown("--resource", idle, "--resource", second.resource, "--state", "leased") == (
        [second.resource],
        ["job-2"],
    )
    code, out, _ = run(capsys, "status", "f", "--owner", "job-1")
    assert code == 0 and "job-1" in out and "job-2" not in out
    code, _, err = run(capsys, "status", "f", "--state", "broken")
    assert code == 2 and "invalid choice" in err


def test_unknown_pool_is_one_line_exit_1_and_creates_nothing(
    env: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, prefix = env
    for argv in (
        ("status", "nope"),
        ("remove", "nope", "r"),
        ("quarantine", "nope", "r", "--for", "5"),
        ("delete", "nope", "--yes"),
        ("gc", "nope"),
    ):
        code, _, err = run(capsys, *argv)
        assert code == 1, argv
        no_traceback(err)
        assert "no pool named 'nope'" in err
    assert redis.Redis.from_url(url).keys(f"{prefix}:*") == []


def test_server_down_wrong_url_and_refused_password(
    env: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = env
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    down = f"redis://:hunter2@127.0.0.1:{port}/0"
    for command in ("status", "pools", "gc", "extend"):
        argv = [command, "--url", down] + ([] if command == "pools" else ["p"])
        if command == "extend":
            argv.append("r")
        code, _, err = run(capsys, *argv)
        assert code == 1
        no_traceback(err)
        assert "cannot reach Redis" in err and "hunter2" not in err and ":***@" in err
    code, _, err = run(capsys, "status", "p", "--url", "http://example.com")
    assert code == 1 and "bad --url" in err
    no_traceback(err)
    # A database that is no number (redis-py takes it for 0): refused.
    where = url.split("//", 1)[1].split("/", 1)[0]
    for path in ("abc", "1x", "-1"):
        code, _, err = run(capsys, "status", "p", "--url", f"redis://{where}/{path}")
        assert code == 1 and "bad --url" in err and repr(path) in err, err
        no_traceback(err)
    admin: Any = redis.Redis.from_url(url)
    user = f"u{uuid.uuid4().hex[:8]}"
    admin.execute_command("ACL", "SETUSER", user, "on", ">right", "~*", "+@all")
    host_port = url.split("//", 1)[1].split("/", 1)[0].split("@")[-1]
    code, _, err = run(capsys, "status", "p", "--url", f"redis://{user}:wrong@{host_port}/0")
    assert code == 1
    no_traceback(err)
    assert "refused the login" in err and "wrong" not in err.split("refused")[0]
    admin.execute_command("ACL", "DELUSER", user)


def test_steering_commands(env: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    url, prefix = env
    pool = FairAllocator(redis.Redis.from_url(url), "steer", prefix=prefix)
    assert run(capsys, "extend", "steer", "a", "b", "c")[0] == 0
    held = pool.acquire(timeout=5)
    code, out, _ = run(capsys, "quarantine", "steer", "b", "--for", "60")
    assert code == 0 and "quarantined" in out
    assert {r.name: r.state for r in pool.status().resources}["b"] == "quarantined"
    code, _, err = run(capsys, "quarantine", "steer", "zz", "--for", "60")
    assert code == 1 and "no resource 'zz'" in err
    code, out, _ = run(capsys, "remove", "steer", "c", "zz")
    assert code == 0 and "1 removed" in out and "1 not in the pool" in out
    code, out, _ = run(capsys, "gc", "steer")
    assert code == 0 and json.loads(out)["pool"] == "steer"
    # In use: refused without --force, one line.
    code, _, err = run(capsys, "delete", "steer", "--yes")
    assert code == 1 and "in use" in err
    no_traceback(err)
    code, out, _ = run(capsys, "delete", "steer", "--yes", "--force")
    assert code == 0 and "deleted" in out
    assert pool.release(held) is False
    assert FairAllocator.pools(redis.Redis.from_url(url), prefix=prefix) == []


def test_watch_prints_one_snapshot_per_interval_off_a_terminal(
    env: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, "extend", "w", "r")
    code, out, _ = run(capsys, "watch", "w", "--interval", "0.01", "--count", "3")
    assert code == 0
    assert out.count("pool 'w' on") == 3


def test_read_only_user_sees_everything(
    env: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, prefix = env
    admin: Any = redis.Redis.from_url(url)
    FairAllocator(admin, "ro", prefix=prefix).extend(["r"])
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    line = next(x for x in doc.splitlines() if x.startswith("ACL SETUSER alloc-monitor "))
    user = f"mon{uuid.uuid4().hex[:6]}"
    words = [w.replace(">CHANGE-ME", ">pw") for w in line.split()[2:]]
    words[0] = user
    words = [f"~{prefix}:*" if w == "~alloc:*" else w for w in words]
    admin.execute_command("ACL", "SETUSER", *words)
    host_port = url.split("//", 1)[1].split("/", 1)[0].split("@")[-1]
    as_monitor = f"redis://{user}:pw@{host_port}/0"
    for argv in (("status", "ro"), ("pools",), ("watch", "ro", "--count", "1")):
        code, out, err = run(capsys, *argv, "--url", as_monitor)
        assert code == 0, err
        assert "pw@" not in out + err
    code, _, err = run(capsys, "extend", "ro", "x", "--url", as_monitor)
    assert code == 1
    no_traceback(err)
    admin.execute_command("ACL", "DELUSER", user)


def test_closed_pipe_ends_quietly(env: tuple[str, str]) -> None:
    url, prefix = env
    FairAllocator(redis.Redis.from_url(url), "big", prefix=prefix).extend(
        [f"resource-{i:05d}" for i in range(3000)]
    )
    with subprocess.Popen(
        [sys.executable, "-m", "allocator", "status", "big"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "REDIS_URL": url, "ALLOCATOR_PREFIX": prefix},
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert b"pool 'big'" in proc.stdout.readline()
        proc.stdout.close()  # `| head -1`
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0
    assert err == ""


# -- metrics -----------------------------------------------------------------


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def load(pool: FairAllocator) -> None:
    """Grants, a timeout and a waiter: something for every metric."""
    held = pool.acquire(timeout=5, owner="metrics-test")
    waiter = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="a waiter")
    pool.release(held)
    pool.release(waiter.join())
    held = pool.acquire(timeout=5)
    with pytest.raises(TimeoutError):
        pool.acquire(timeout=0.01)
    Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="a second waiter")


def test_collector_in_process(env: tuple[str, str]) -> None:
    url, prefix = env
    pool = FairAllocator(redis.Redis.from_url(url), "m", prefix=prefix)
    pool.extend(["r"])
    load(pool)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AllocatorCollector([pool]))
    values = scrape(generate_latest(registry).decode())
    p = (("pool", "m"),)
    assert values[("allocator_leases", p)] == 1
    assert values[("allocator_waiting", p)] == 1
    assert values[("allocator_grants_total", p)] == 3
    assert values[("allocator_timeouts_total", p)] == 1
    assert values[("allocator_wait_seconds_count", p)] == 3
    assert values[("allocator_wait_seconds_bucket", (("le", "+Inf"), ("pool", "m")))] == 3
    assert values[("allocator_resources", (("pool", "m"), ("state", "leased")))] == 1
    assert values[("allocator_oldest_wait_seconds", p)] >= 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_endpoint_is_scraped_over_http(env: tuple[str, str]) -> None:
    url, prefix = env
    pool = FairAllocator(redis.Redis.from_url(url), "served", prefix=prefix)
    pool.extend(["r", "s"])
    pool.quarantine("s", 60)
    load(pool)
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "allocator", "metrics", "--all", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "REDIS_URL": url, "ALLOCATOR_PREFIX": prefix},
    ) as proc:
        try:
            served(proc, url, prefix, port)
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def served(proc: Any, url: str, prefix: str, port: int) -> None:
    """Scrape the running ``allocator metrics --all`` twice."""
    assert b"serving http://" in proc.stderr.readline()
    values = scrape(get(f"http://127.0.0.1:{port}/metrics"))
    p = (("pool", "served"),)
    assert values[("allocator_grants_total", p)] == 3
    assert values[("allocator_resources", (("pool", "served"), ("state", "quarantined")))] == 1
    assert values[("allocator_waiting", p)] == 1
    # --all lists the pools again at each reading (in the background): a
    # new one shows up.
    FairAllocator(redis.Redis.from_url(url), "later", prefix=prefix).extend(["x"])
    wait_until(
        lambda: (
            ("allocator_leases", (("pool", "later"),))
            in scrape(get(f"http://127.0.0.1:{port}/metrics"))
        ),
        timeout=20,
    )


def get(address: str) -> str:
    with urllib.request.urlopen(address, timeout=10) as reply:
        return str(reply.read().decode())


# -- a Redis Cluster ---------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server on PATH")
    from _cluster import LocalCluster

    with LocalCluster(masters=3) as made:
        yield f"redis://127.0.0.1:{made.nodes[0].port}/0"


def test_commands_against_a_cluster(
    cluster_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", cluster_url)
    monkeypatch.setenv("ALLOCATOR_PREFIX", "clu")
    names = [f"pool-{i}" for i in range(6)]  # spread over the masters
    for name in names:
        assert run(capsys, "extend", name, "r1", "r2")[0] == 0
    code, out, err = run(capsys, "pools", "--json")
    assert code == 0, err
    assert [row["pool"] for row in json.loads(out)] == names
    code, out, err = run(capsys, "status", "pool-3", "--json")
    assert code == 0 and json.loads(out)["size"] == 2
    assert run(capsys, "quarantine", "pool-3", "r1", "--for", "30")[0] == 0
    assert run(capsys, "gc", "pool-4")[0] == 0
    assert run(capsys, "delete", "pool-5", "--yes")[0] == 0
    code, out, _ = run(capsys, "pools")
    assert "pool-5" not in out and "pool-4" in out


def test_the_grafana_dashboard_uses_only_exported_metrics(env: tuple[str, str]) -> None:
    url, prefix = env
    pool = FairAllocator(redis.Redis.from_url(url), "g", prefix=prefix)
    pool.extend(["r"])
    pool.release(pool.acquire(timeout=5, tenant="t"))  # the tenant series too
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AllocatorCollector([pool]))
    exported = {name for name, _ in scrape(generate_latest(registry).decode())}
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text(encoding="utf-8"))
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"allocator_[a-z_]+", target["expr"])
    }
    assert used and used <= exported, used - exported
    documented = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    families = {re.sub("_(total|bucket|count|sum)$", "", name) for name in exported}
    assert all(f"`{name}" in documented for name in families), families


def test_the_library_imports_without_the_tools_and_never_imports_them() -> None:
    code = (
        "import sys\n"
        "for name in ('rich', 'prometheus_client', 'fakeredis'):\n"
        "    sys.modules[name] = None\n"
        "import allocator, allocator.metrics\n"
        "assert not any(m.startswith('allocator.cli') for m in sys.modules), sorted(sys.modules)\n"
        "from allocator.cli import main\n"
        "sys.exit(main(['pools']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        "allocator: the command line needs the 'cli' extra (rich, prometheus-client, "
        "fakeredis): pip install 'redis-fair-allocator[cli]'"
    )
    # The library below never imports the tools above it (__main__ only
    # hands `python -m allocator` over to them).
    library = [p for p in (ROOT / "allocator").glob("*.py") if p.name != "__main__.py"]
    texts = {p.name: p.read_text(encoding="utf-8") for p in library}
    assert texts and not [n for n, t in texts.items() if "allocator.cli" in t or ".cli " in t]


def test_watch_on_a_terminal_refreshes_in_place(env: tuple[str, str]) -> None:
    import pty

    url, prefix = env
    FairAllocator(redis.Redis.from_url(url), "tty", prefix=prefix).extend(["r"])
    leader, follower = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "allocator", "watch", "tty", "--interval", "0.05", "--count", "3"],
        stdout=follower,
        stderr=follower,
        env={**os.environ, "REDIS_URL": url, "ALLOCATOR_PREFIX": prefix, "COLUMNS": "120"},
    ) as proc:
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=60) == 0
    os.close(leader)
    text = seen.decode(errors="replace")
    assert "pool 'tty'" in text and "Traceback" not in text
    # Drawn in place: the cursor goes back up over the view between refreshes.
    assert "\x1b[" in text


def test_demo_reads_redis_url_and_never_prints_its_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("REDIS_URL", f"redis://:hunter2@127.0.0.1:{port}/0")
    code, out, err = run(capsys, "demo", "--quiet")
    assert code == 1
    no_traceback(err)
    assert "cannot reach" in err and ":***@" in err
    assert "hunter2" not in out + err


def test_human_durations() -> None:
    from allocator.cli._common import ago, safe_url

    assert [ago(x) for x in (0.005, 0.4, 2.44, 12.4, 150, 7500, 3 * 86400)] == [
        "5 ms", "400 ms", "2.4 s", "12 s", "2 min", "2 h 5 min", "3 d",
    ]  # fmt: skip
    assert ago(-30) == "-30 s"
    assert safe_url("redis://u:secret@h:6379/0") == "redis://u:***@h:6379/0"
    assert safe_url("unix:///run/r.sock?password=secret&db=2") == (
        "unix:///run/r.sock?password=***&db=2"
    )


# -- the real command, in a subprocess -----------------------------------------


def allocator_command() -> list[str]:
    """The installed ``allocator`` console script (``python -m allocator``
    where it is not installed next to this Python)."""
    script = Path(sys.executable).with_name("allocator")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "allocator"]


def cli(
    *argv: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``allocator ARGV`` to its end (REDIS_URL and ALLOCATOR_PREFIX
    come from the environment the ``env`` fixture sets)."""
    return subprocess.run(
        [*allocator_command(), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*allocator_command(), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_quarantine_end_puts_the_resource_back_and_serves_a_waiter(env: tuple[str, str]) -> None:
    url, prefix = env
    pool = FairAllocator(redis.Redis.from_url(url), "qe", prefix=prefix)
    pool.extend(["a", "b"])
    held = pool.acquire(timeout=5)
    other = next(name for name in ("a", "b") if name != held.resource)
    done = cli("quarantine", "qe", other, "--for", "600")
    assert done.returncode == 0 and "quarantined for 10 min" in done.stdout
    waiter = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="a waiter behind the quarantine")
    done = cli("quarantine", "qe", other, "--end")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"pool 'qe': {other!r} quarantine ended, back in rotation\n"
    assert waiter.join().resource == other  # served at once, not in 10 minutes
    # Not quarantined (it is leased now): said, and nothing changes.
    done = cli("quarantine", "qe", other, "--end")
    assert done.returncode == 0 and "was not quarantined" in done.stdout
    assert one_error_line(cli("quarantine", "qe", "zz", "--end")) == (
        "allocator: pool 'qe' has no resource 'zz'"
    )
    assert cli("quarantine", "qe", "zz", "--end").returncode == 1
    # One of --for and --end: usage errors.
    for argv in (("quarantine", "qe", other), ("quarantine", "qe", other, "--for", "5", "--end")):
        done = cli(*argv)
        assert done.returncode == 2 and "usage:" in done.stderr, argv


def test_every_option_of_every_command_has_a_help_text() -> None:
    import argparse

    from allocator.cli import _parser

    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) >= {"status", "watch", "quarantine", "metrics", "demo", "bench"}
    missing = [
        (name, action.option_strings or action.dest)
        for name, sub in [("", parser), *commands.choices.items()]
        for action in sub._actions
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert missing == []
    done = cli("quarantine", "--help")
    assert done.returncode == 0
    assert "--for SECONDS" in done.stdout and "comes back by itself" in done.stdout
    assert "--end" in done.stdout


def test_the_exit_code_table_is_in_the_help_and_the_docs() -> None:
    from allocator.cli import EXIT_CODES

    done = cli("--help")
    assert done.returncode == 0
    assert EXIT_CODES in done.stdout
    for code in ("0", "1", "2", "130"):
        assert re.search(rf"^  {code} +\S", EXIT_CODES, re.M), code
    documented = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert EXIT_CODES in documented


def test_demo_and_bench_say_unreachable_and_refused_login_in_one_line_exit_1(
    redis_url: str,
) -> None:
    admin: Any = redis.Redis.from_url(redis_url)
    user = f"u{uuid.uuid4().hex[:8]}"
    admin.execute_command("ACL", "SETUSER", user, "on", ">right", "~*", "+@all")
    host_port = redis_url.split("//", 1)[1].split("/", 1)[0].split("@")[-1]
    refused = f"redis://{user}:hunter2@{host_port}/0"
    down = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    try:
        for command in (["demo", "--quiet"], ["bench", "--quick", "--no-json"]):
            done = cli(*command, "--url", down)
            assert done.returncode == 1, done.stderr
            line = one_error_line(done)
            assert line.startswith("allocator: cannot reach Redis at redis://:***@127.0.0.1:")
            done = cli(*command, "--url", refused)
            assert done.returncode == 1, done.stderr
            line = one_error_line(done)
            assert "refused the login" in line and "cannot reach" not in line
            assert "hunter2" not in done.stdout + done.stderr
    finally:
        admin.execute_command("ACL", "DELUSER", user)


def test_demo_and_bench_on_a_cluster(cluster_url: str) -> None:
    done = cli("demo", "--quiet", "--url", cluster_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Redis Cluster at" in done.stdout and "all checks passed" in done.stdout
    done = cli(
        "bench", "--quick", "--only", "uncontended", "--no-json", "--url", cluster_url, timeout=300
    )
    # 1 would be a missed target on a busy machine; a failed scenario says so.
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "Redis Cluster node" in done.stdout
    assert "uncontended acquire+release, p50" in done.stdout
    assert "scenario uncontended failed" not in done.stdout
    # Neither left a key behind, on any master.
    for port in _cluster_ports(cluster_url):
        node = redis.Redis(port=port)
        assert [k for k in node.scan_iter() if b"demo-" in k or k.startswith(b"allocbench")] == []


def _cluster_ports(url: str) -> list[int]:
    from redis.cluster import RedisCluster

    client: Any = RedisCluster.from_url(url)
    try:
        return [int(node.port) for node in client.get_primaries()]
    finally:
        client.close()


def test_watch_waits_for_a_pool_that_does_not_exist_yet(env: tuple[str, str]) -> None:
    url, prefix = env
    with start("watch", "later", "--interval", "0.05") as proc:
        try:
            assert proc.stderr is not None and proc.stdout is not None
            first = proc.stderr.readline()
            assert first.startswith("allocator watch: no pool named 'later' (prefix ")
            assert "waiting for it" in first
            assert proc.poll() is None  # still watching
            FairAllocator(redis.Redis.from_url(url), "later", prefix=prefix).extend(["r"])
            while True:
                line = proc.stdout.readline()
                assert line, "watch ended before it showed the pool"
                if "pool 'later' on" in line:
                    break
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0
    assert err == ""  # said once: nothing after the first line
    assert "Traceback" not in out
    # With --count, a pool still missing at the last look is an error, in
    # one line (before: a line saying it waits, then the error).
    for count in ("1", "3"):
        done = cli("watch", "never", "--interval", "0.01", "--count", count)
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("allocator: no pool named 'never'")


def test_the_status_header_counts_slots_and_leases(env: tuple[str, str]) -> None:
    url, prefix = env
    client = redis.Redis.from_url(url)
    slots = FairAllocator(client, "slots", prefix=prefix)
    slots.extend(["p1", "p2", "p3", "p4"], capacity=2)
    slots.acquire(timeout=5)
    done = cli("status", "slots")
    assert done.returncode == 0
    assert "4 resources (8 slots): 7 free slots, 1 lease, 0 waiting" in done.stdout
    one = FairAllocator(client, "one", prefix=prefix)
    one.extend(["p1", "p2", "p3", "p4"])
    held = one.acquire(timeout=5)
    one.quarantine(next(r for r in ("p1", "p2") if r != held.resource), 60)
    done = cli("watch", "one", "--count", "1")
    assert done.returncode == 0
    header = done.stdout.splitlines()[0]
    assert header.endswith(": 4 resources: 2 free, 1 lease, 0 waiting; 1 quarantined"), header


def test_the_headline_of_every_state() -> None:
    from allocator import PoolStatus, ResourceStatus
    from allocator.cli.views import headline

    def row(name: str, state: str, leases: int = 0, capacity: int = 3, **kw: Any) -> Any:
        return ResourceStatus(
            name=name, capacity=capacity, priority=0, leases=leases, state=state, **kw
        )

    rows = (
        row("a", "free", leases=1),
        row("b", "leased", leases=3),
        row("c", "quarantined", until=10.0),
        row("d", "quarantined", until=10.0, throttled=True),
        row("e", "draining", leases=1),
    )
    status = PoolStatus(
        name="p", size=5, free=1, leased=5, waiting=2, oldest_wait=1.5, resources=rows
    )
    assert headline(status) == (
        "5 resources (15 slots): 2 free slots, 5 leases, 2 waiting (oldest for 1.5 s); "
        "1 quarantined, 1 rate-limited, 1 draining"
    )
    single = PoolStatus(
        name="p", size=1, free=0, leased=1, waiting=0, resources=(row("a", "leased", 1, 1),)
    )
    assert headline(single) == "1 resource: 0 free, 1 lease, 0 waiting"


def test_sigterm_ends_metrics_and_watch_with_status_0(env: tuple[str, str]) -> None:
    url, prefix = env
    FairAllocator(redis.Redis.from_url(url), "term", prefix=prefix).extend(["r"])
    for argv, ready in (
        (("metrics", "term", "--port", "0"), "serving http://"),
        (("watch", "term", "--interval", "0.05"), "pool 'term' on"),
    ):
        with start(*argv) as proc:
            try:
                assert proc.stderr is not None and proc.stdout is not None
                stream = proc.stderr if argv[0] == "metrics" else proc.stdout
                assert ready in stream.readline()
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert proc.returncode == 0, (argv, err)
        assert "Traceback" not in err


def test_version_works_without_the_cli_extra(tmp_path: Path) -> None:
    # A plain install: rich, prometheus_client and fakeredis cannot be imported.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "for name in ('rich', 'prometheus_client', 'fakeredis'):\n"
        "    sys.modules[name] = None\n",
        encoding="utf-8",
    )
    hidden = {"PYTHONPATH": str(tmp_path)}
    done = cli("--version", env=hidden)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"allocator \d+\.\d+\.\d+\S*\n", done.stdout), done.stdout
    done = cli("status", "x", env=hidden)
    assert done.returncode == 1
    assert "pip install 'redis-fair-allocator[cli]'" in one_error_line(done)


def test_revoke_ends_one_lease_and_status_shows_each_holder(env: tuple[str, str]) -> None:
    url, prefix = env
    pool = FairAllocator(redis.Redis.from_url(url), "rv", prefix=prefix)
    pool.extend(["a"])
    held = pool.acquire(timeout=5)
    done = cli("status", "rv", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert [lease["holder_present"] for lease in shown["leases"]] == [True]
    assert shown["absent_holders"] == 0
    assert "connected" in cli("status", "rv").stdout
    waiter = Background(lambda: pool.acquire(timeout=30))
    wait_until(lambda: pool.status().waiting == 1, what="a waiter")
    done = cli("revoke", "rv", "a")
    assert done.returncode == 0, done.stderr
    assert "lease on 'a' revoked" in done.stdout
    assert waiter.join().resource == "a"  # served at once
    with pytest.raises(LeaseLost):
        pool.renew(held)
    done = cli("revoke", "rv", "a", "--token", str(held.token))
    assert done.returncode == 1
    assert one_error_line(done) == (
        f"allocator: pool 'rv' has no live lease on 'a' with token {held.token}"
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("metrics", "--all", "--port", "-1"), "--port: must be 0 to 65535"),
        (("metrics", "--all", "--port", "70000"), "--port: must be 0 to 65535"),
        (("status", "p", "--url", ""), "--url: must not be empty"),
        (("pools", "--prefix", ""), "--prefix: must not be empty"),
        (("watch", "p", "--count", "0"), "--count: must be 1 or more"),
        (("watch", "p", "--count", "-1"), "--count: must be 1 or more"),
        (("demo", "--pool", ""), "--pool: must not be empty"),
    ],
)
def test_bad_values_on_the_line_are_usage_errors(argv: tuple[str, ...], says: str) -> None:
    """Before these checks, a port out of range printed a traceback; an empty
    --url (an unset "$VAR") meant localhost:6379; an empty --prefix, a
    --count of 0 and an empty demo --pool were taken."""
    done = cli(*argv, env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr


@pytest.mark.parametrize("variable", ["REDIS_URL", "ALLOCATOR_PREFIX"])
def test_a_variable_set_but_empty_is_refused(variable: str) -> None:
    env = {"REDIS_URL": "redis://127.0.0.1:1/0", variable: ""}
    done = cli("pools", env=env)
    assert done.returncode == 1
    assert one_error_line(done) == (
        f"allocator: {variable} is set but empty: give a value or unset it"
    )


def test_order_weight_and_the_tenants_in_status_and_leases(
    env: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``allocator order`` and ``weight`` steer the tenant order
    (docs/concepts.md#tenants); ``status`` shows the order and a row per
    tenant, ``leases`` the tenant of each lease."""
    url, prefix = env
    pool = FairAllocator(redis.Redis.from_url(url), "ten", prefix=prefix)
    assert run(capsys, "extend", "ten", "a")[0] == 0
    code, out, _ = run(capsys, "order", "ten", "tenant")
    assert code == 0 and "order tenant" in out
    code, out, _ = run(capsys, "weight", "ten", "crawler-a", "3")
    assert code == 0 and "weight 3" in out
    held = pool.acquire(timeout=5, tenant="crawler-a")
    waiter = Background(lambda: pool.acquire(timeout=30, tenant="crawler-b"))
    wait_until(lambda: pool.status().waiting == 1, what="a waiter")
    code, out, _ = run(capsys, "status", "ten", "--json")
    view = json.loads(out)
    assert code == 0 and view["order"] == "tenant"
    rows = {t["name"]: t for t in view["tenants"]}
    assert (rows["crawler-a"]["leases"], rows["crawler-a"]["weight"]) == (1, 3.0)
    assert rows["crawler-b"]["waiting"] == 1
    assert view["leases"][0]["tenant"] == "crawler-a"
    code, out, _ = run(capsys, "status", "ten")
    assert code == 0 and "order tenant" in out and "crawler-b" in out
    code, out, _ = run(capsys, "leases", "ten")
    assert code == 0 and "tenant" in out and "crawler-a" in out
    pool.release(held)
    pool.release(waiter.join())
    code, out, _ = run(capsys, "order", "ten", "fifo")
    assert code == 0 and pool.status().order == "fifo"
    code, _, err = run(capsys, "order", "nope", "fifo")
    assert code == 1 and "no pool named 'nope'" in err
    code, _, err = run(capsys, "order", "ten", "lifo")
    assert code == 2 and "invalid choice" in err
    code, _, err = run(capsys, "weight", "ten", "x", "500")
    assert code == 2 and "0.01 to 100" in err


def test_bench_two_tenants_reports_both_orders(
    env: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``allocator bench --only tenants`` runs the two-tenant load in the
    order fifo and in the order tenant, and reports the lone tenant's wait
    and the CPU per grant of each (figures 9a to 9c; their verdicts are
    timings, which this test does not judge)."""
    out = tmp_path / "bench.json"
    main(["bench", "--quick", "--only", "tenants", "--window", "1", "--json", str(out)])
    capsys.readouterr()
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["failed_scenarios"] == [] and report["problems"] == []
    rows = {row["key"]: row for row in report["rows"]}
    assert set(rows) == {"9a", "9b", "9c"}
    for row in rows.values():
        assert row["value"] > 0 and row["baseline"] > 0, row
    details = report["details"]["tenants"]
    for order in ("fifo", "tenant"):
        (run,) = details[order]["runs"]
        assert run["lone_grants"] > 0 and run["burst_grants"] > 0, run


def test_bench_times_the_floor_beside_the_cycle_and_leaves_nothing(
    env: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``allocator bench --only uncontended`` times the floor's cycle (a
    bare library that sends only a grant's commands, figure 1f) next to a
    PING, in a pass of its own after the pool's cycle, where the server has
    Functions; on a server it does not own it takes the library and its
    keys away."""
    url, _ = env
    server = redis.Redis.from_url(url)
    functions = int(str(server.info("server")["redis_version"]).split(".")[0]) >= 7
    out = tmp_path / "bench.json"
    main(["bench", "--quick", "--only", "uncontended", "--json", str(out)])
    capsys.readouterr()
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["failed_scenarios"] == [] and report["problems"] == []
    rows = {row["key"]: row for row in report["rows"]}
    assert set(rows) == {"1", "1f"}
    assert rows["1f"]["target"] is None  # a figure to compare with, not a goal
    if functions:
        assert rows["1f"]["value"] > 0 and rows["1f"]["baseline"] > 0
        assert rows["1f"]["verdict"] == "report"
        details = report["details"]["uncontended"]
        # As many samples as the pool's cycle, each with its PING.
        counts = {details[k]["count"] for k in ("cycle_ns", "floor_ping_ns", "floor_cycle_ns")}
        assert len(counts) == 1
        assert server.function_list(library="allocator_bench_floor") == []
    else:
        assert rows["1f"]["value"] is None and rows["1f"]["verdict"] == "n/a"
    assert list(server.scan_iter(match="allocbench*")) == []
