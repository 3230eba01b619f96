"""MkDocs hooks: the pages link to files of the repository outside docs/
(lua/README.md, CHANGELOG.md, examples/gc_job.py), which work when the
Markdown is read in the repository. For the site, those files become pages
of their own, generated at build time from the files themselves (nothing
copied by hand, so nothing drifts), and the links are pointed at them; any
other link that leads nowhere fails ``mkdocs build --strict``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent

#: repository file -> (page in the site, how to show it)
PAGES = {
    "lua/README.md": ("reference/key-layout.md", "markdown"),
    "CHANGELOG.md": ("reference/changelog.md", "markdown"),
    "examples/gc_job.py": ("reference/gc_job.md", "python"),
}


def on_files(files: Files, config: Any) -> Files:
    for source, (page, kind) in PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        if kind != "markdown":
            text = f"# {source}\n\n```{kind}\n{text}\n```\n"
        files.append(File.generated(config, page, content=text))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    depth = page.file.src_uri.count("/")
    up = "../" * depth
    for source, (target, _) in PAGES.items():
        markdown = markdown.replace(f"](../{source}", f"]({up}{target}")
    return markdown
