"""MkDocs hook: the repository's root pages in the site, with links that work there and on GitHub.

README.md and BENCHMARKS.md stay at the repository root, where GitHub and PyPI show them, and
link into ``docs/`` (``docs/usage.md``); the pages under ``docs/`` link back (``../README.md``).
The hook adds the two root files to the site as ``index.md`` and ``benchmark-results.md`` and, as
each page is rendered, points every relative link that leaves its folder on disk at the site's
page for that file: ``docs/usage.md`` from README becomes ``usage.md``, ``../BENCHMARKS.md`` from
``docs/usage.md`` becomes ``benchmark-results.md``. A link to any other file outside ``docs/`` is
left as it is, so that ``mkdocs build --strict`` reports it (write such a path as ``code``, or
link a page of the site).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit
from xml.etree.ElementTree import Element

from markdown import Markdown
from markdown.extensions import Extension
from markdown.treeprocessors import Treeprocessor
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmark-results.md"}
"""Repository-root file -> its page in the site."""

_page: Page | None = None  # the page being rendered (pages render one at a time)


def _root(config: MkDocsConfig) -> str:
    return os.path.dirname(os.path.abspath(config.config_file_path))


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.markdown_extensions.append(_RootLinks(config))  # type: ignore[arg-type]
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for source, page in ROOT_PAGES.items():
        if files.get_file_from_path(page) is not None:
            raise PluginError(f"docs/{page} would hide {source}, which the site shows as {page}")
        files.append(File.generated(config, page, abs_src_path=os.path.join(_root(config), source)))
    return files


def on_page_markdown(markdown: str, page: Page, **kwargs: Any) -> str:
    global _page
    _page = page
    return markdown


class _RootLinks(Extension):
    def __init__(self, config: MkDocsConfig) -> None:
        super().__init__()
        self.config = config

    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 - Markdown's name
        # after the inline patterns have made the links (20), before MkDocs resolves them (0)
        md.treeprocessors.register(_LinkRewriter(md, self.config), "cdsl_root_links", 1)


class _LinkRewriter(Treeprocessor):
    def __init__(self, md: Markdown, config: MkDocsConfig) -> None:
        super().__init__(md)
        self.root = _root(config)
        self.docs = os.path.abspath(config.docs_dir)
        self.pages = {os.path.join(self.root, source): page for source, page in ROOT_PAGES.items()}

    def run(self, root: Element) -> None:
        if _page is None:
            return
        src_uri = _page.file.src_uri
        if src_uri in ROOT_PAGES.values():
            folder = self.root
        else:
            folder = os.path.join(self.docs, os.path.dirname(src_uri))
        for element in root.iter():
            attribute = {"a": "href", "img": "src"}.get(element.tag)
            if attribute and element.get(attribute):
                element.set(attribute, self._rewrite(element.get(attribute), folder, src_uri))

    def _rewrite(self, url: str, folder: str, src_uri: str) -> str:
        scheme, netloc, path, query, anchor = urlsplit(url)
        if scheme or netloc or not path or path.startswith(("/", "\\")):
            return url
        target = os.path.normpath(os.path.join(folder, unquote(path)))
        if target in self.pages:
            site_uri = self.pages[target]
        elif target == self.docs or target.startswith(self.docs + os.sep):
            site_uri = os.path.relpath(target, self.docs).replace(os.sep, "/")
        else:
            return url  # outside docs/: left for the strict build to report
        new_path = posixpath.relpath(site_uri, posixpath.dirname(src_uri) or ".")
        return urlunsplit(("", "", new_path, query, anchor))
