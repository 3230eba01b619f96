"""allocator/_sync.py and allocator/_sync_admin.py are generated from
allocator/_async.py and allocator/_async_admin.py by
docs/scripts/async_to_sync.py: the checked-in files are what the script
makes, ``--check`` says so when one is not, and the rules of the rewrite
hold."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path("docs/scripts/async_to_sync.py")
COMMAND = "python docs/scripts/async_to_sync.py"
PAIRS = [
    ("_async.py", "_sync.py"),
    ("_async_admin.py", "_sync_admin.py"),
    ("_async_keepalive.py", "_sync_keepalive.py"),
]


def read(name: str, root: Path = ROOT) -> str:
    return (root / "allocator" / name).read_text(encoding="utf-8")


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
    (tmp_path / "allocator").mkdir()
    for name in ["_acompat.py", *(name for pair in PAIRS for name in pair)]:
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
        copy / "allocator" / "_async_admin.py",
        '"""Drop the soft binding of `name`; True if there was a live one."""',
        '"""Drop the soft binding of `name`: True if there was a live one."""',
    )
    stale = run(copy, "--check")
    assert stale.returncode == 1
    assert "allocator/_sync_admin.py" in stale.stderr
    assert "allocator/_sync.py" not in stale.stderr
    assert run(copy).returncode == 0
    assert '"""Drop the soft binding of `name`: True if there was a live one."""' in read(
        "_sync_admin.py", copy
    )
    assert read("_sync.py", copy) == read("_sync.py")


def test_the_rewrite() -> None:
    """The blocking twin of each asyncio form, read from the output."""
    for name, twin in PAIRS:
        assert read(name).splitlines()[0] == (
            f"# the source of allocator/{twin}: run docs/scripts/async_to_sync.py after an edit"
        )
        assert read(twin).splitlines()[0] == (
            f"# generated from allocator/{name} by docs/scripts/async_to_sync.py: do not edit"
        )
    source = "".join(read(name) for name, _ in PAIRS)
    sync = "".join(read(twin) for _, twin in PAIRS)
    for asyncio_form, blocking_form in [
        ("    async def acquire(\n", "    def acquire(\n"),
        ("lease = await self._drive_waiting(", "lease = self._drive_waiting("),
        ("@contextlib.asynccontextmanager\n", "@contextlib.contextmanager\n"),
        ("def __aenter__(self) -> AsyncFairAllocator:", "def __enter__(self) -> FairAllocator:"),
        ("from ._async_io import", "from ._sync_io import"),
        ("class AsyncFairAllocator(AsyncAdmin):", "class FairAllocator(Admin):"),
        ('__all__ = ["AsyncAdmin"]', '__all__ = ["Admin"]'),
        ("[key async for key in scan]", "[key for key in scan]"),
        ("AWorker(self._run", "Worker(self._run"),
        ("async with pool.lease(timeout=10)", "with pool.lease(timeout=10)"),
        ("every ttl/3 from a task", "every ttl/3 from a daemon thread"),
        ("`redis.asyncio.Redis`", "`redis.Redis`"),
    ]:  # fmt: skip
        assert asyncio_form in source and asyncio_form not in sync, asyncio_form
        assert blocking_form in sync, blocking_form
    # The docstrings are written once for both classes and may name asyncio
    # in prose ("(asyncio: a task)"); the code may not.
    for word in ("await ", "async def", "async with", "async for", "import asyncio", "Async"):
        assert word not in sync, word


def test_a_rule_that_matches_nothing_fails_the_run(copy: Path) -> None:
    edit(copy / "allocator" / "_async.py", "FakeAsyncRedis", "FakeRedis")
    done = run(copy, "--check")
    assert done.returncode == 2
    assert "FakeAsyncRedis" in done.stderr


def test_asyncio_left_in_the_output_fails_the_run(copy: Path) -> None:
    edit(
        copy / "allocator" / "_async_keepalive.py",
        "        await self._worker.stop()\n",
        "        await self._worker.stop()\n        await asyncio.sleep(0)\n",
    )
    done = run(copy)
    assert done.returncode == 2
    assert "asyncio" in done.stderr


def test_the_imports_are_put_back_in_order() -> None:
    """A renamed name takes its place among the others (``AsyncIterator``
    sorts first, ``Iterator`` after ``Callable``), as ruff's isort orders
    them (constants, classes, then the rest); ``._async_io`` sorts before
    ``._core``, ``._sync_io`` after ``._scripts``."""

    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert "from collections.abc import AsyncIterator\n" in read("_async.py")
    assert "from collections.abc import Iterator\n" in read("_sync.py")
    for _, twin in PAIRS:
        for line in read(twin).splitlines():
            if line.startswith("from ") and " import " in line and "(" not in line:
                names = [n.strip() for n in line.split(" import ", 1)[1].split(",")]
                assert names == sorted(names, key=kind), line
    for name in ("_sync.py", "_sync_admin.py"):
        lines = read(name).splitlines()
        relative = [line.split()[1] for line in lines if line.startswith("from .")]
        assert relative == sorted(relative, key=str.lower)
        assert relative.index("._sync_io") > relative.index("._scripts")
