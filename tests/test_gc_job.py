"""``examples/gc_job.py``: it reports each gc run, and stops cleanly on SIGTERM or SIGINT."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from _workers import server_now
from helpers import wait_until

from allocator import FairAllocator

pytestmark = pytest.mark.real_redis

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "gc_job.py"


def start_job(url: str, pool: str, every: float) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-W", "error", str(SCRIPT), "--url", url, "--pool", pool,
         "--every", str(every)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def stop_job(job: subprocess.Popen[str], signum: int) -> str:
    job.send_signal(signum)
    try:
        out, err = job.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate()
        raise AssertionError("the gc job did not stop within 30 s") from None
    assert job.returncode == 0, f"exit {job.returncode}\n{out}\n{err}"
    assert err == "", err
    return out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_gc_job_reports_and_stops_cleanly(redis_url: str, pool_name: str, signum: int) -> None:
    client: Any = redis.Redis.from_url(redis_url)
    pool = FairAllocator(client, pool_name)
    pool.extend(["r"])
    # A holder that vanished: its lease runs out, and nothing else touches
    # the pool, so the job's first run is the one that reclaims it.
    dead = pool.acquire(timeout=5, ttl=0.05)
    wait_until(lambda: server_now(client) > dead.expires_at + 0.01, what="the lease's deadline")

    job = start_job(redis_url, pool_name, every=0.2)
    try:
        assert job.stdout is not None
        first = job.stdout.readline()
        assert re.search(r"GCReport\(reclaimed=1, dropped_waiters=0, expired_bindings=0", first), (
            first
        )
        second = job.stdout.readline()  # it goes on running
        assert "reclaimed=0" in second, second
    finally:
        out = stop_job(job, signum)
    assert out.rstrip().endswith("gc job stopped"), out
    assert pool.status().free == 1
    client.close()


def test_gc_job_stops_during_a_long_pause(redis_url: str, pool_name: str) -> None:
    job = start_job(redis_url, pool_name, every=3600)
    try:
        assert job.stdout is not None
        assert "GCReport(" in job.stdout.readline()
    finally:
        out = stop_job(job, signal.SIGTERM)
    assert out.rstrip().endswith("gc job stopped"), out


def test_gc_job_in_process(
    redis_url: str, pool_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``main(argv)`` runs in-process too; SIGTERM raised inside ends it with 0."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gc_job_example", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    original = FairAllocator.gc

    def gc_then_term(self: FairAllocator) -> Any:
        report = original(self)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives during the run: it finishes first
        return report

    before = signal.getsignal(signal.SIGTERM)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FairAllocator, "gc", gc_then_term)
        assert module.main(["--url", redis_url, "--pool", pool_name, "--every", "3600"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before
    out = capsys.readouterr().out
    assert out.count("GCReport(") == 1 and "gc job stopped" in out


def test_gc_job_outlives_a_server_restart(pool_name: str) -> None:
    """The docs call it the same loop as ``allocator gc --every``: a failed
    run is one line on stderr, and the job goes on (before: a traceback and
    exit on the first Redis error)."""
    from allocator._server import RedisServer

    with RedisServer() as own:
        job = start_job(own.url, pool_name, every=0.1)
        try:
            assert job.stdout is not None and job.stderr is not None
            assert "GCReport(" in job.stdout.readline()
            own.stop()
            failed = job.stderr.readline()
            assert failed.startswith("gc job: run failed, ConnectionError"), failed
            own.start()
            while True:  # runs that failed while the server was down, then a good one
                line = job.stdout.readline()
                assert line, "the job ended"
                if "GCReport(" in line:
                    break
            assert job.poll() is None
        finally:
            job.send_signal(signal.SIGTERM)
            out, _err = job.communicate(timeout=30)
        assert job.returncode == 0
        assert out.rstrip().endswith("gc job stopped"), out


def test_gc_job_refused_password_is_one_line_and_exit_1(pool_name: str) -> None:
    from allocator._server import RedisServer

    with RedisServer() as own:
        redis.Redis.from_url(own.url).config_set("requirepass", "right")
        url = own.url.replace("redis://", "redis://:wrong@")
        job = start_job(url, pool_name, every=0.1)
        out, err = job.communicate(timeout=60)
        assert job.returncode == 1, (out, err)
        assert err.count("\n") == 1 and "AuthenticationError" in err, err
