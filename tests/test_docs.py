"""The documentation site builds with ``mkdocs build --strict``, and a dead
link or anchor makes that build fail (mkdocs.yml's validation settings)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    for part in ("docs", "lua", "examples"):
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
