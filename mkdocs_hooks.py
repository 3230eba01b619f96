"""MkDocs hooks: the pages link to files of the repository outside docs/
(lua/README.md, CHANGELOG.md, examples/gc_job.py), which work when the
Markdown is read in the repository. For the site, those files become pages
of their own, generated at build time from the files themselves (nothing
copied by hand, so nothing drifts), and the links are pointed at them; any
other link that leads nowhere fails ``mkdocs build --strict``.

MkDocs checks the anchors of the links written in the pages, not of those
in the docstrings that mkdocstrings renders into the API reference: after
the build, every link of the site to an anchor of one of its own pages is
checked in the built HTML, and one that leads nowhere is a warning too."""

from __future__ import annotations

import logging
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

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


#: The allocators take their administration methods (extend, status, gc, ...)
#: from a base class (allocator/_async_admin.py and the generated
#: _sync_admin.py). mkdocstrings renders them as the class's own, but a
#: docstring's short link (``[`extend`][]``) is looked up among the class's
#: own members only. Each name of the reference's headings that such a link
#: may use is registered here, after the API page is rendered, as another
#: name of the heading of its method on the page.
SHORT_LINKS = "allocator.FairAllocator."


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri != "api.md":
        return html
    autorefs = config.plugins.get("autorefs")
    if autorefs is None:
        return html
    ids = _Anchors()
    ids.feed(html)
    for anchor in sorted(ids.ids):
        name = anchor.removeprefix(SHORT_LINKS)
        # The blocking class's method: the asyncio class's docstrings say the same.
        if name != anchor and "." not in name:
            autorefs.register_anchor(page, name, anchor, primary=False)
    return html


log = logging.getLogger("mkdocs.hooks.anchors")


class _Anchors(HTMLParser):
    """The ids of a built page and the links it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            elif name == "href" and tag == "a" and value:
                self.links.append(value)


def on_post_build(config: Any) -> None:
    site = Path(config.site_dir)
    pages: dict[Path, _Anchors] = {}
    for html in sorted(site.rglob("*.html")):
        parser = _Anchors()
        parser.feed(html.read_text(encoding="utf-8"))
        pages[html.resolve()] = parser
    for html, parser in pages.items():
        for link in parser.links:
            url = urlsplit(link)
            if url.scheme or url.netloc or not url.fragment:
                continue
            target = (html.parent / unquote(url.path)).resolve() if url.path else html
            if target.is_dir():
                target = target / "index.html"
            if target in pages and unquote(url.fragment) not in pages[target].ids:
                page = html.relative_to(site.resolve())
                log.warning("%s links to %r, an anchor that its page does not have", page, link)
