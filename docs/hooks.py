"""MkDocs hooks: what the site takes from the repository when it builds.

- ``<!-- config-reference -->`` in a page becomes every config field's table, from the
  schema (``trainflow.config.reference``).
- The benchmark results (``benchmarks/results.md``, ``benchmarks/results/**/*.md``) become
  pages of the site at the same paths, so that the Benchmarks page links to them and a
  reader stays on the site; a quick run's results (``results/quick/``) are left out.
- A relative link from a page to a file of the repository outside ``docs/`` (a config, an
  example, a script) becomes a link to that file under ``repo_url``, once the file is found
  in the checkout: a link to a missing file fails the strict build, as a broken link
  between pages does. The same relative link works as written where the Markdown is read
  in the repository itself.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File

from trainflow.config.reference import markdown as config_reference

REPO = Path(__file__).resolve().parents[1]
DOCS = "docs"  # docs_dir, relative to the repository's root
BRANCH = "main"  # the branch repo_url's links name
CONFIG_REFERENCE = "<!-- config-reference -->"
RESULTS = REPO / "benchmarks" / "results"
# A Markdown link's target: [text](target) or ![alt](target), up to a space or a title.
LINK = re.compile(r"(\]\()([^)\s]+)")

log = get_plugin_logger(__name__)


def results_pages() -> list[str]:
    """The benchmark results files the site shows, as paths in the repository."""
    found = [RESULTS.with_suffix(".md"), *sorted(RESULTS.rglob("*.md"))]
    return [
        path.relative_to(REPO).as_posix()
        for path in found
        if path.is_file() and "quick" not in path.relative_to(RESULTS.parent).parts
    ]


def as_page(text: str) -> str:
    """A results file as a page: a section's file opens at a second-level heading, which
    becomes the page's title."""
    return text if text.startswith("# ") else re.sub(r"^## ", "# ", text, count=1, flags=re.M)


def on_files(files, config):
    for path in results_pages():
        files.append(File.generated(config, path, content=as_page((REPO / path).read_text())))
    return files


def repository_link(target: str, page: str, copied: set[str], repo_url: str) -> str | None:
    """Where a relative link of the page ``page`` (its path under docs/, or a results
    page's in the repository) that leaves docs/ points on the site: the copied page, or
    the file under ``repo_url``. None when it stays inside docs/ (MkDocs checks those),
    is not relative, or names nothing in the repository (logged: the strict build fails)."""
    if re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target, re.I):
        return None
    path, _, fragment = target.partition("#")
    folder = posixpath.dirname(page) if page in copied else posixpath.join(DOCS, posixpath.dirname(page))
    in_repo = posixpath.normpath(posixpath.join(folder, path))
    if in_repo == DOCS or in_repo.startswith(f"{DOCS}/"):
        return None
    anchor = f"#{fragment}" if fragment else ""
    if in_repo in copied:
        return posixpath.relpath(in_repo, posixpath.dirname(page) or ".") + anchor
    found = REPO / in_repo
    if in_repo.startswith("../") or not found.exists():
        log.warning("%s links to %s: %s is not a file of the repository", page, target, in_repo)
        return None
    kind = "tree" if found.is_dir() else "blob"
    return f"{repo_url.rstrip('/')}/{kind}/{BRANCH}/{in_repo}{anchor}"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CONFIG_REFERENCE in markdown:
        markdown = markdown.replace(CONFIG_REFERENCE, config_reference())
    copied = set(results_pages())

    def relink(match: re.Match) -> str:
        target = repository_link(match[2], page.file.src_uri, copied, config["repo_url"])
        return match[0] if target is None else f"{match[1]}{target}"

    return LINK.sub(relink, markdown)


def on_serve(server, config, builder):
    """``make docs-serve`` rebuilds when a results file changes, as it does for a page."""
    for path in (RESULTS.with_suffix(".md"), RESULTS):
        server.watch(str(path))
    return server
