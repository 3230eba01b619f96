"""The README's promise: with no redis-server on PATH and no REDIS_URL, the
suite falls back to fakeredis and skips what needs a real server; under
CI=true the same set-up is a failure, never a silent fallback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_suite(tmp_path: Path, *args: str, ci: bool) -> subprocess.CompletedProcess[str]:
    drop = ("CI", "REDIS_URL", "ALLOCATOR_TEST_SERVER")  # the matrix picks a build: none here
    env = {k: v for k, v in os.environ.items() if k not in drop}
    bare = tmp_path / "bin"  # a PATH without redis-server (nor anything else)
    bare.mkdir(exist_ok=True)
    env["PATH"] = str(bare)
    if ci:
        env["CI"] = "true"
    # -n0: one process, not the default's xdist workers (what is checked
    # here is the fallback, not how the tests are spread).
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n0",
         f"--basetemp={tmp_path / 'inner'}", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_without_redis_server_real_redis_tests_are_skipped(tmp_path: Path) -> None:
    # test_recovery starts servers of its own: before the fix its tests
    # failed with FileNotFoundError instead of being skipped.
    done = run_suite(tmp_path, "tests/test_recovery.py", "tests/test_gc_job.py", ci=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " skipped" in done.stdout and "failed" not in done.stdout and "error" not in done.stdout


def test_under_ci_a_missing_redis_server_fails_the_run(tmp_path: Path) -> None:
    done = run_suite(tmp_path, "tests/test_recovery.py", ci=True)
    assert done.returncode != 0
    assert "CI=true but redis-server is not on PATH" in done.stdout + done.stderr
