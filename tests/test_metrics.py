"""The Prometheus collector (allocator.metrics) and ``allocator metrics``:
per-resource series and their limit, quarantines by cause, ``allocator_up``
and one log line per outage. Every exposition is parsed with
``prometheus_client.parser``."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from helpers import wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from allocator import FairAllocator
from allocator._server import RedisServer, find_redis_server, free_port
from allocator.metrics import DEFAULT_PER_RESOURCE_LIMIT, AllocatorCollector

pytestmark = pytest.mark.real_redis

Labels = tuple[tuple[str, str], ...]


def scrape_text(text: str) -> dict[tuple[str, Labels], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def scrape(collector: AllocatorCollector) -> dict[tuple[str, Labels], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return scrape_text(generate_latest(registry).decode())


def series(values: dict[tuple[str, Labels], float], name: str) -> dict[Labels, float]:
    return {labels: v for (n, labels), v in values.items() if n == name}


@pytest.fixture
def prefix() -> str:
    return f"m{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


def test_per_resource_state_and_leases(client: redis.Redis, prefix: str) -> None:
    pool = FairAllocator(client, "per", prefix=prefix)
    pool.extend(["a", "b"])
    pool.extend(["c"], capacity=3)
    pool.quarantine("b", 60)
    for _ in range(4):  # a once, c three times: every slot in rotation
        pool.acquire(timeout=5)
    pool.extend(["d"])
    assert pool.acquire(timeout=5).resource == "d"
    pool.remove(["d"])  # leased: it drains
    pool.extend(["e"])
    want = {
        "a": ("leased", 1),
        "b": ("quarantined", 0),
        "c": ("leased", 3),
        "d": ("draining", 1),
        "e": ("free", 0),
    }
    assert {r.name: (r.state, r.leases) for r in pool.status().resources} == want
    values = scrape(AllocatorCollector([pool]))
    state = series(values, "allocator_resource_state")
    assert state == {
        (("pool", "per"), ("resource", name), ("state", st)): (1 if st == current else 0)
        for name, (current, _) in want.items()
        for st in ("free", "leased", "quarantined", "draining")
    }
    assert series(values, "allocator_resource_leases") == {
        (("pool", "per"), ("resource", name)): leases for name, (_, leases) in want.items()
    }
    # Turned off: only the pool-wide series.
    values = scrape(AllocatorCollector([pool], per_resource=False))
    assert not series(values, "allocator_resource_state")
    assert not series(values, "allocator_resource_leases")
    assert series(values, "allocator_leases") == {(("pool", "per"),): 5}


def test_per_resource_limit_leaves_a_large_pool_out_with_one_warning(
    client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert DEFAULT_PER_RESOURCE_LIMIT == 1000
    big = FairAllocator(client, "big", prefix=prefix)
    big.extend([f"r{i}" for i in range(5)])
    small = FairAllocator(client, "small", prefix=prefix)
    small.extend(["x"])
    collector = AllocatorCollector([big, small], per_resource_limit=4)
    with caplog.at_level(logging.INFO, logger="allocator"):
        for _ in range(3):
            values = scrape(collector)
            state = series(values, "allocator_resource_state")
            assert {dict(labels)["pool"] for labels in state} == {"small"}
            assert series(values, "allocator_resources")[(("pool", "big"), ("state", "free"))] == 5
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "pool 'big' has 5 resources, more than the per-resource limit (4)" in (
        warnings[0].getMessage()
    )
    with pytest.raises(ValueError, match="per_resource_limit"):
        AllocatorCollector([big], per_resource_limit=0)
    with pytest.raises(TypeError, match="per_resource"):
        AllocatorCollector([big], per_resource="no")  # type: ignore[arg-type]


def test_quarantines_by_cause_are_exported(client: redis.Redis, prefix: str) -> None:
    pool = FairAllocator(client, "q", prefix=prefix)
    pool.extend(["a", "b"])
    values = scrape(AllocatorCollector([pool]))
    assert series(values, "allocator_quarantines_total") == {
        (("cause", "operator"), ("pool", "q")): 0,
        (("cause", "release"), ("pool", "q")): 0,
    }


def test_quarantines_by_cause_count_each_quarantine(client: redis.Redis, prefix: str) -> None:
    """Counted by the scripts (PoolStats.quarantined_on_release and
    quarantined_by_operator): a quarantine shorter than a scrape still shows."""
    pool = FairAllocator(client, "qc", prefix=prefix)
    pool.extend(["a", "b"])
    pool.quarantine("a", 0.001)
    pool.quarantine("b", 60)
    lease = pool.acquire(timeout=5)
    pool.release(lease, quarantine=0.001)
    values = scrape(AllocatorCollector([pool]))
    assert series(values, "allocator_quarantines_total") == {
        (("cause", "operator"), ("pool", "qc")): 2,
        (("cause", "release"), ("pool", "qc")): 1,
    }


def test_up_per_pool_and_one_warning_per_outage(
    client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    if find_redis_server() is None:
        pytest.skip("no redis-server on PATH")
    healthy = FairAllocator(client, "healthy", prefix=prefix)
    healthy.extend(["r"])
    # (Kept on disk: a pool the restart lost would be allocator_up 0, no pool.)
    with RedisServer(appendonly=True) as server:
        other = redis.Redis.from_url(server.url)
        flaky = FairAllocator(other, "flaky", prefix=prefix)
        flaky.extend(["r"])
        collector = AllocatorCollector([healthy, flaky])
        up = series(scrape(collector), "allocator_up")
        assert up == {(("pool", "healthy"),): 1, (("pool", "flaky"),): 1}
        server.stop()
        with caplog.at_level(logging.INFO, logger="allocator"):
            for _ in range(3):
                values = scrape(collector)
                assert series(values, "allocator_up") == {
                    (("pool", "healthy"),): 1,
                    (("pool", "flaky"),): 0,
                }
                # The pool that cannot be read has no figures, rather than old ones.
                assert (("pool", "flaky"),) not in series(values, "allocator_leases")
            down = [r for r in caplog.records if r.name == "allocator"]
            assert len(down) == 1, [r.getMessage() for r in down]
            assert down[0].levelno == logging.WARNING and down[0].exc_info is None
            message = down[0].getMessage()
            assert message.startswith(
                "allocator metrics: cannot read pool 'flaky' (ConnectionError"
            )
            assert "\n" not in message
            caplog.clear()
            server.start()
            up = series(scrape(collector), "allocator_up")
            assert up == {(("pool", "healthy"),): 1, (("pool", "flaky"),): 1}
            back = [r.getMessage() for r in caplog.records if r.name == "allocator"]
            assert back == ["allocator metrics: pool 'flaky' can be read again"]
        other.close()


def test_up_of_a_collector_that_lists_the_pools(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    if find_redis_server() is None:
        pytest.skip("no redis-server on PATH")
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        FairAllocator(client, "listed", prefix=prefix).extend(["r"])
        collector = AllocatorCollector(client=client, prefix=prefix)
        assert series(scrape(collector), "allocator_up") == {
            (("pool", ""),): 1,  # the listing: no pool label in Prometheus
            (("pool", "listed"),): 1,
        }
        server.stop()
        with caplog.at_level(logging.INFO, logger="allocator"):
            for _ in range(2):
                assert series(scrape(collector), "allocator_up") == {
                    (("pool", ""),): 0,
                    (("pool", "listed"),): 0,  # known from the last listing
                }
        messages = [r.getMessage() for r in caplog.records if r.name == "allocator"]
        assert len(messages) == 1, messages
        assert messages[0].startswith(
            f"allocator metrics: cannot read the list of pools under prefix {prefix!r} and "
            "pool 'listed' (ConnectionError"
        )
        client.close()


def test_metrics_command_with_the_server_down_says_so_once_then_stops_on_sigterm(
    prefix: str,
) -> None:
    if find_redis_server() is None:
        pytest.skip("no redis-server on PATH")
    port = free_port()
    with RedisServer() as server:
        FairAllocator(redis.Redis.from_url(server.url), "web", prefix=prefix).extend(["p1", "p2"])
        with subprocess.Popen(
            [*allocator_command(), "metrics", "--all", "--port", str(port), "--no-per-resource"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "REDIS_URL": server.url, "ALLOCATOR_PREFIX": prefix},
        ) as proc:
            try:
                assert proc.stderr is not None
                assert "serving http://" in proc.stderr.readline()
                values = scrape_text(get(f"http://127.0.0.1:{port}/metrics"))
                assert series(values, "allocator_up") == {(("pool", ""),): 1, (("pool", "web"),): 1}
                assert not series(values, "allocator_resource_state")  # --no-per-resource
                server.stop()
                # Read in the background: the next reading finds it down.
                down = {(("pool", ""),): 0, (("pool", "web"),): 0}
                wait_until(up_is(f"http://127.0.0.1:{port}/metrics", down), timeout=20)
                for _ in range(2):
                    values = scrape_text(get(f"http://127.0.0.1:{port}/metrics"))
                    assert series(values, "allocator_up") == {
                        (("pool", ""),): 0,
                        (("pool", "web"),): 0,
                    }
                proc.send_signal(15)  # SIGTERM
                _, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert proc.returncode == 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("allocator metrics: cannot read the list of pools under prefix")


def test_metrics_command_ends_on_sigterm_during_a_scrape(prefix: str) -> None:
    """SIGTERM while a scrape waits on Redis ends the exporter at once, with
    exit 0 and no traceback. Before, wsgiref caught the Terminated (it
    catches everything a request raises), logged it as a traceback, answered
    500 and went on serving: the SIGTERM was lost. That also happened when
    the SIGTERM came just after a reply was written, on a loaded machine."""
    if find_redis_server() is None:
        pytest.skip("no redis-server on PATH")
    port = free_port()
    with RedisServer() as server:
        FairAllocator(redis.Redis.from_url(server.url), "web", prefix=prefix).extend(["p1"])
        with subprocess.Popen(
            [*allocator_command(), "metrics", "web", "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "REDIS_URL": server.url, "ALLOCATOR_PREFIX": prefix},
        ) as proc:
            try:
                assert proc.stderr is not None
                assert "serving http://" in proc.stderr.readline()
                server.stop()
                # In its place, a server that takes connections and never
                # answers: the next scrape waits on it.
                with (
                    socket.create_server(("127.0.0.1", server.port)) as silent,
                    socket.create_connection(("127.0.0.1", port), timeout=30) as scraper,
                ):
                    scraper.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    silent.settimeout(30)
                    waiting, _ = silent.accept()
                    with waiting:
                        assert waiting.recv(4096)  # the exporter is inside the scrape
                        proc.send_signal(signal.SIGTERM)
                        _, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err


def test_metrics_command_per_resource_limit(redis_url: str, prefix: str) -> None:
    FairAllocator(redis.Redis.from_url(redis_url), "wide", prefix=prefix).extend(["a", "b", "c"])
    port = free_port()
    with subprocess.Popen(
        [*allocator_command(), "metrics", "wide", "--port", str(port), "--per-resource-limit", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "REDIS_URL": redis_url, "ALLOCATOR_PREFIX": prefix},
    ) as proc:
        try:
            assert proc.stderr is not None
            assert "serving http://" in proc.stderr.readline()
            for _ in range(2):
                values = scrape_text(get(f"http://127.0.0.1:{port}/metrics"))
                assert not series(values, "allocator_resource_state")
                assert series(values, "allocator_up") == {(("pool", "wide"),): 1}
            proc.send_signal(15)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0
    assert err.strip().splitlines() == [
        "allocator metrics: pool 'wide' has 3 resources, more than the per-resource limit (2): "
        "its allocator_resource_* series are left out (per_resource_limit=, allocator metrics "
        "--per-resource-limit)"
    ]


# -- scrapes that never wait on Redis ------------------------------------------------


def scrapes_at_once(address: str, n: int = 4) -> list[tuple[float, dict[Labels, float]]]:
    """``n`` scrapes at the same time: how long each took, and its allocator_up."""
    got: list[tuple[float, dict[Labels, float]]] = []

    def one() -> None:
        started = time.monotonic()
        values = scrape_text(get(address))
        got.append((time.monotonic() - started, series(values, "allocator_up")))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(got) == n
    return got


@contextlib.contextmanager
def exporter(url: str, prefix: str, *argv: str) -> Iterator[tuple[str, Callable[[], str]]]:
    """``allocator metrics ARGV --interval 0.2`` on a free port: its address,
    and what it wrote on stderr so far (read once it is stopped)."""
    port = free_port()
    with subprocess.Popen(
        [*allocator_command(), "metrics", *argv, "--port", str(port), "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "REDIS_URL": url, "ALLOCATOR_PREFIX": prefix},
    ) as proc:
        err: list[str] = []
        try:
            assert proc.stderr is not None
            while True:
                line = proc.stderr.readline()
                assert line, "the exporter ended before it served"
                err.append(line)
                if "serving http://" in line:
                    break
            yield f"http://127.0.0.1:{port}/metrics", lambda: "".join(err)
            proc.send_signal(signal.SIGTERM)
            err.append(proc.communicate(timeout=30)[1])
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def up_is(address: str, want: dict[Labels, float]) -> Callable[[], bool]:
    return lambda: series(scrape_text(get(address)), "allocator_up") == want


@pytest.mark.parametrize("outage", ["stopped", "hung"])
def test_concurrent_scrapes_answer_at_once_when_the_server_is_down_or_hung(
    prefix: str, outage: str
) -> None:
    """Before, a scrape with the server down took 2 s, and scrapes were
    served one at a time (four at once: 2, 4, 6, 8 s): Prometheus timed the
    target out and never stored ``allocator_up 0``. Now the pools are read
    in the background and a scrape answers from memory."""
    if find_redis_server() is None:
        pytest.skip("no redis-server on PATH")
    with RedisServer() as server:
        FairAllocator(redis.Redis.from_url(server.url), "web", prefix=prefix).extend(["p1"])
        with exporter(server.url, prefix, "web") as (address, _):
            for _took, up in scrapes_at_once(address):
                assert up == {(("pool", "web"),): 1}
            values = scrape_text(get(address))
            assert 0 <= series(values, "allocator_scrape_age_seconds")[(("pool", "web"),)] < 5
            pid = int(redis.Redis.from_url(server.url).info("server")["process_id"])
            if outage == "stopped":
                server.stop()
            else:
                os.kill(pid, signal.SIGSTOP)
            try:
                wait_until(up_is(address, {(("pool", "web"),): 0}), timeout=20)
                for _ in range(2):
                    got = scrapes_at_once(address)
                    assert all(up == {(("pool", "web"),): 0} for _, up in got), got
                    # Generous: a scrape answers in milliseconds; it took 2 to 8 s.
                    assert max(took for took, _ in got) < 1.0, got
                values = scrape_text(get(address))
                assert series(values, "allocator_scrape_age_seconds")[(("pool", "web"),)] > 0.2
                assert not series(values, "allocator_leases")  # no figures of a pool not read
            finally:
                if outage == "hung":
                    os.kill(pid, signal.SIGCONT)


def test_exporter_started_with_the_server_down_waits_for_it_and_for_the_pool(
    prefix: str,
) -> None:
    """The exporter starts, and serves ``allocator_up 0``, while Redis is
    down; then 0 while the pool does not exist; then 1."""
    if find_redis_server() is None:
        pytest.skip("no redis-server on PATH")
    server = RedisServer()  # not started yet
    try:
        with exporter(server.url, prefix, "web", "later") as (address, err):
            for took, up in scrapes_at_once(address):
                assert up == {(("pool", "web"),): 0, (("pool", "later"),): 0}
                assert took < 1.0
            server.start()
            client = redis.Redis.from_url(server.url)
            FairAllocator(client, "web", prefix=prefix).extend(["p1"])
            wait_until(up_is(address, {(("pool", "web"),): 1, (("pool", "later"),): 0}), timeout=20)
            FairAllocator(client, "later", prefix=prefix).extend(["p1"])
            wait_until(up_is(address, {(("pool", "web"),): 1, (("pool", "later"),): 1}), timeout=20)
            client.close()
        text = err()
        assert "Traceback" not in text
        assert "cannot reach Redis" in text.splitlines()[0]
        assert "no pool named 'later', yet" in text
    finally:
        server.close()


def test_a_collector_reading_in_the_background(client: redis.Redis, prefix: str) -> None:
    with pytest.raises(ValueError, match="interval"):
        AllocatorCollector(client=client, prefix=prefix, interval=0)
    with pytest.raises(ValueError, match="stale"):
        AllocatorCollector(client=client, prefix=prefix, stale=1)
    pool = FairAllocator(client, "bg", prefix=prefix)
    pool.extend(["a"])
    collector = AllocatorCollector([pool], interval=0.05)
    try:
        assert collector.wait_first_reading(10)
        lease = pool.acquire(timeout=5)
        wait_until(lambda: series(scrape(collector), "allocator_leases") == {(("pool", "bg"),): 1})
        pool.release(lease)
    finally:
        collector.close()


def allocator_command() -> list[str]:
    script = Path(sys.executable).with_name("allocator")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "allocator"]


def get(address: str) -> str:
    with urllib.request.urlopen(address, timeout=30) as reply:
        assert reply.status == 200
        return str(reply.read().decode())


def test_tenant_series_with_a_limit_and_the_rest_summed(client: redis.Redis, prefix: str) -> None:
    """Per tenant: waiting, leases and grants; requests that name none are
    ``(none)``, tenants beyond the limit are summed under ``(other)`` (the
    most grants keep their own series); and the pool's order."""
    pool = FairAllocator(client, "ten", prefix=prefix)
    pool.extend(["a", "b", "c"])
    for tenant, grants in (("t1", 4), ("t2", 3), ("t3", 1), ("t4", 1)):
        for _ in range(grants):
            pool.release(pool.acquire(timeout=5, tenant=tenant))
    held = [pool.acquire(timeout=5, tenant="t3"), pool.acquire(timeout=5, tenant="t4")]
    held.append(pool.acquire(timeout=5))
    pool.set_order("tenant")
    values = scrape(AllocatorCollector([pool], tenant_limit=2))
    grants = series(values, "allocator_tenant_grants_total")
    assert grants == {
        (("pool", "ten"), ("tenant", "t1")): 4,
        (("pool", "ten"), ("tenant", "t2")): 3,
        (("pool", "ten"), ("tenant", "(other)")): 2 + 2 + 1,  # t3, t4, (none)
    }
    leases = series(values, "allocator_tenant_leases")
    assert leases[(("pool", "ten"), ("tenant", "(other)"))] == 3
    assert series(values, "allocator_order") == {
        (("order", "fifo"), ("pool", "ten")): 0,
        (("order", "tenant"), ("pool", "ten")): 1,
        (("order", "building"), ("pool", "ten")): 0,
    }
    values = scrape(AllocatorCollector([pool], tenant_limit=None))
    leases = series(values, "allocator_tenant_leases")
    assert leases[(("pool", "ten"), ("tenant", "(none)"))] == 1
    assert leases[(("pool", "ten"), ("tenant", "t3"))] == 1
    assert sum(series(values, "allocator_tenant_grants_total").values()) == 12
    # A pool whose requests name no tenant, in the order fifo: no series.
    plain = FairAllocator(client, "plain", prefix=prefix)
    plain.extend(["x"])
    plain.release(plain.acquire(timeout=5))
    assert not series(scrape(AllocatorCollector([plain])), "allocator_tenant_grants_total")
    with pytest.raises(ValueError, match="tenant_limit"):
        AllocatorCollector([pool], tenant_limit=0)
    for lease in held:
        pool.release(lease)
