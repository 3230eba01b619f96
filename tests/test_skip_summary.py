"""A run on the fakeredis fallback (no redis-server on PATH, no REDIS_URL)
ends with a loud summary of what was skipped and why (tests/conftest.py),
so that it does not read as green; a run on a real server has none."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOME = ("tests/test_bench_logic.py", "tests/test_cli.py::test_human_durations")


def run_pytest(
    tmp_path: Path, *args: str, server: bool, workers: int = 0
) -> subprocess.CompletedProcess[str]:
    """An inner run of pytest; ``workers``: pytest-xdist's -n (0: one process)."""
    drop = ("CI", "REDIS_URL", "ALLOCATOR_TEST_SERVER")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if not server:
        bare = tmp_path / "bin"  # a PATH without redis-server (nor anything else)
        bare.mkdir(exist_ok=True)
        env["PATH"] = str(bare)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"-n{workers}",
         f"--basetemp={tmp_path / 'inner'}", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist"])
def test_the_fallback_says_loudly_what_was_skipped(tmp_path: Path, workers: int) -> None:
    """Under pytest-xdist (the default run) the summary is the controller's,
    which runs no test and has no server of its own: it says it all the same."""
    done = run_pytest(tmp_path, *SOME, server=False, workers=workers)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    passed = int(re.search(r"(\d+) passed", done.stdout).group(1))  # type: ignore[union-attr]
    assert passed > 1
    banner = f"NOT TESTED: 1 of {passed + 1} tests ({100 / (passed + 1):.0f} %) were skipped"
    assert banner in done.stdout, done.stdout[-3000:]
    tail = done.stdout[done.stdout.index(banner) :]
    assert "fakeredis only (no redis-server on PATH and no REDIS_URL)" in tail
    assert "     1  needs a real redis-server (fakeredis fallback)" in tail
    assert "apt-get install redis-server" in tail


def test_a_run_on_a_real_server_has_no_such_summary(tmp_path: Path, redis_url: str) -> None:
    done = run_pytest(tmp_path, "tests/test_cli.py::test_human_durations", server=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout and "NOT TESTED" not in done.stdout
