"""The documentation site builds with ``mkdocs build --strict``, and a dead
link or anchor makes that build fail (mkdocs.yml's validation settings, and
mkdocs_hooks.py for the links in docstrings). The API reference is built
from the docstrings, and AsyncFairAllocator's say what FairAllocator's say."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from allocator import AsyncFairAllocator, FairAllocator

ROOT = Path(__file__).resolve().parent.parent


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_of_the_docs(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for part in ("docs", "lua", "examples", "allocator"):
        shutil.copytree(ROOT / part, root / part)
    for name in ("mkdocs.yml", "mkdocs_hooks.py", "CHANGELOG.md"):
        shutil.copy(ROOT / name, root / name)
    return root


def test_the_site_builds_strict_and_a_dead_link_fails_it(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    root = copy_of_the_docs(tmp_path)
    done = build(root, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "reference" / "key-layout" / "index.html").is_file()
    assert (tmp_path / "site" / "grafana-dashboard.json").is_file()
    page = root / "docs" / "operations.md"
    text = page.read_text(encoding="utf-8")
    for dead in ("[gone](nowhere.md)", "[gone](concepts.md#no-such-anchor)", "[gone](../nope.md)"):
        page.write_text(text + f"\n{dead}\n", encoding="utf-8")
        failed = build(root, tmp_path / "site2")
        assert failed.returncode != 0, dead
        assert (
            "nowhere.md" in failed.stderr
            or "no-such-anchor" in failed.stderr
            or "nope.md" in (failed.stderr)
        )


def test_the_api_reference_is_built_from_the_docstrings(tmp_path: Path) -> None:
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed")
    root = copy_of_the_docs(tmp_path)
    done = build(root, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    text = re.sub(r"<[^>]+>", "", page)
    for anchor in ("allocator.FairAllocator.acquire", "allocator.AsyncFairAllocator.release"):
        assert f'id="{anchor}"' in page, anchor
    for rendered in (
        "reclaim_on_disconnect: bool = False",  # a signature
        "Wait in line for a resource and lease it.",  # a docstring
        "The fencing token: strictly greater",  # an attribute of a value
    ):
        assert rendered in text, rendered
    # A link in a docstring to an anchor that is not there fails the build.
    values = root / "allocator" / "_values.py"
    source = values.read_text(encoding="utf-8")
    dead = "[gone](concepts.md#no-such-anchor)"
    values.write_text(source.replace("A granted lease", f"A {dead} granted lease"), "utf-8")
    failed = build(root, tmp_path / "site2")
    assert failed.returncode != 0
    assert "concepts/#no-such-anchor" in failed.stderr


#: The words in which the docstrings of AsyncFairAllocator differ from those
#: of FairAllocator: the reference shows both classes, and says the same of
#: each method.
ASYNC_WORDS = [
    (r"\bwith (pool\.|FairAllocator\()", r"async with \1"),
    (r"(?<!Async)\bFairAllocator\b", "AsyncFairAllocator"),
    (r"\bredis\.cluster\.RedisCluster\b", "redis.asyncio.cluster.RedisCluster"),
    (r"\bredis\.Redis\b", "redis.asyncio.Redis"),
    (r"\bFakeRedis\b", "FakeAsyncRedis"),
]


def test_the_async_docstrings_say_what_the_sync_ones_say() -> None:
    def words(doc: str | None) -> str:
        return " ".join((doc or "").split())

    names = ["", *(name for name in dir(FairAllocator) if not name.startswith("_"))]
    for name in names:
        sync = inspect.getdoc(getattr(FairAllocator, name) if name else FairAllocator)
        aio = inspect.getdoc(getattr(AsyncFairAllocator, name) if name else AsyncFairAllocator)
        assert sync, f"FairAllocator.{name} has no docstring"
        expected = words(sync)
        for pattern, replacement in ASYNC_WORDS:
            expected = re.sub(pattern, replacement, expected)
        assert words(aio) == expected, name or "the class"
