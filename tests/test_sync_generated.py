"""allocator/_sync.py is generated from allocator/_async.py by
docs/scripts/async_to_sync.py: the checked-in file is what the script makes,
``--check`` says so when it is not, and the rules of the rewrite hold."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path("docs/scripts/async_to_sync.py")
COMMAND = "python docs/scripts/async_to_sync.py"


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / SCRIPT), *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_sync_module_is_what_the_async_one_makes() -> None:
    done = run(ROOT, "--check")
    assert done.returncode == 0, done.stderr


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """What the script reads and writes, in a tree of its own."""
    for name in ("_async.py", "_sync.py", "_acompat.py"):
        (tmp_path / "allocator").mkdir(exist_ok=True)
        shutil.copy(ROOT / "allocator" / name, tmp_path / "allocator" / name)
    (tmp_path / SCRIPT.parent).mkdir(parents=True)
    shutil.copy(ROOT / SCRIPT, tmp_path / SCRIPT)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")  # ruff's settings
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_a_stale_sync_module_fails_the_check_and_is_written_again(copy: Path) -> None:
    sync = copy / "allocator" / "_sync.py"
    good = sync.read_text(encoding="utf-8")
    sync.write_text(good + "# an edit by hand\n", encoding="utf-8")
    stale = run(copy, "--check")
    assert stale.returncode == 1
    assert stale.stderr.count("\n") == 1 and COMMAND in stale.stderr, stale.stderr
    assert sync.read_text(encoding="utf-8").endswith(
        "# an edit by hand\n"
    )  # --check writes nothing
    assert run(copy).returncode == 0
    assert sync.read_text(encoding="utf-8") == good
    assert run(copy, "--check").returncode == 0


def test_an_edit_of_the_async_module_makes_the_sync_one_stale(copy: Path) -> None:
    edit(
        copy / "allocator" / "_async.py",
        '"""Drop the binding of ``name``; True if there was one."""',
        '"""Drop the binding of ``name``: True if there was one."""',
    )
    assert run(copy, "--check").returncode == 1
    assert run(copy).returncode == 0
    sync = (copy / "allocator" / "_sync.py").read_text(encoding="utf-8")
    assert '"""Drop the binding of ``name``: True if there was one."""' in sync


def test_the_rewrite() -> None:
    """The blocking twin of each asyncio form, read from the output."""
    source = (ROOT / "allocator" / "_async.py").read_text(encoding="utf-8")
    sync = (ROOT / "allocator" / "_sync.py").read_text(encoding="utf-8")
    assert source.splitlines()[0].startswith("# allocator/_sync.py is generated from this file")
    assert sync.splitlines()[0] == (
        "# generated from allocator/_async.py by docs/scripts/async_to_sync.py: do not edit"
    )
    for asyncio_form, blocking_form in [
        ("    async def acquire(\n", "    def acquire(\n"),
        ("lease = await self._drive_waiting(", "lease = self._drive_waiting("),
        ("@contextlib.asynccontextmanager\n", "@contextlib.contextmanager\n"),
        ("def __aenter__(self) -> AsyncFairAllocator:", "def __enter__(self) -> FairAllocator:"),
        ("from ._async_io import", "from ._sync_io import"),
        ("[key async for key in scan]", "[key for key in scan]"),
        ("AWorker(self._run", "Worker(self._run"),
        ("async with pool.lease(timeout=10)", "with pool.lease(timeout=10)"),
        ("lease\n        from a task every", "lease\n        from a daemon thread every"),
        ("``redis.asyncio.Redis``", "``redis.Redis``"),
    ]:  # fmt: skip
        assert asyncio_form in source and asyncio_form not in sync, asyncio_form
        assert blocking_form in sync, blocking_form
    for word in ("await ", "async ", "asyncio.", "Async", "a task"):
        assert word not in sync, word


def test_a_rule_that_matches_nothing_fails_the_run(copy: Path) -> None:
    edit(copy / "allocator" / "_async.py", "FakeAsyncRedis", "FakeRedis")
    done = run(copy, "--check")
    assert done.returncode == 2
    assert "FakeAsyncRedis" in done.stderr


def test_asyncio_left_in_the_output_fails_the_run(copy: Path) -> None:
    edit(
        copy / "allocator" / "_async.py",
        "        await self._worker.stop()\n",
        "        await self._worker.stop()\n        await asyncio.sleep(0)\n",
    )
    done = run(copy)
    assert done.returncode == 2
    assert "asyncio" in done.stderr


def test_the_imports_are_put_back_in_order() -> None:
    """``AsyncIterator`` sorts first, ``Iterator`` after ``Callable``;
    ``._async_io`` before ``._core``, ``._sync_io`` after ``._scripts``."""
    sync = (ROOT / "allocator" / "_sync.py").read_text(encoding="utf-8")
    assert "from collections.abc import Callable, Iterable, Iterator\n" in sync
    lines = sync.splitlines()
    relative = [line.split()[1] for line in lines if line.startswith("from .")]
    assert relative == sorted(relative, key=str.lower)
    assert relative.index("._sync_io") == relative.index("._scripts") + 1
