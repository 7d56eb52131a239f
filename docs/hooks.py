"""MkDocs hooks: what the site takes from the repository when it builds.

- ``<!-- config-reference -->`` in a page becomes every config field's table, from the
  schema (``trainflow.config.reference``).
- The benchmark results (``benchmarks/results.md``, ``benchmarks/results/**/*.md``) become
  pages of the site at the same paths, so that the Benchmarks page links to them and a
  reader stays on the site; a quick run's results (``results/quick/``) are left out.
- Each folder of ``examples/`` becomes a page of the site, its ``README.md`` at the same
  path, listed under the nav's Examples section after its overview; ``<!-- examples -->``
  in a page (``docs/examples.md``) becomes a section per folder: its title, what it shows
  (the README's first paragraph), how to run it (its first shell block) and its files (not
  those git ignores). A folder without a README fails the strict build.
- A relative link from a page to a file of the repository outside ``docs/`` (a config, an
  example, a script) becomes a link to that file under ``repo_url``, once the file is found
  in the checkout: a link to a missing file fails the strict build, as a broken link
  between pages does. A link to a copied page (a results file, an example's README or its
  folder) stays on the site. The same relative link works as written where the Markdown is
  read in the repository itself.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File

from trainflow.config.reference import markdown as config_reference

REPO = Path(__file__).resolve().parents[1]
DOCS = "docs"  # docs_dir, relative to the repository's root
BRANCH = "main"  # the branch repo_url's links name
CONFIG_REFERENCE = "<!-- config-reference -->"
EXAMPLES_LIST = "<!-- examples -->"
RESULTS = REPO / "benchmarks" / "results"
EXAMPLES = REPO / "examples"
EXAMPLES_NAV = "Examples"  # the nav section each example's page joins
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


def example_folders() -> list[Path]:
    """The folders of ``examples/``, each one example (caches and hidden folders left out)."""
    return sorted(
        path for path in EXAMPLES.iterdir() if path.is_dir() and not path.name.startswith((".", "_"))
    )


def example_pages() -> list[str]:
    """Each example's README, as a path in the repository; a folder without one is logged
    (the strict build fails) and left out."""
    pages = []
    for folder in example_folders():
        readme = folder / "README.md"
        if readme.is_file():
            pages.append(readme.relative_to(REPO).as_posix())
        else:
            log.warning("%s has no README.md: an example says what it shows and how to run it", folder.name)
    return pages


def copied_pages() -> set[str]:
    """The repository's files that are pages of the site at their own paths."""
    return {*results_pages(), *example_pages()}


def ignored(paths: list[Path]) -> set[Path]:
    """Which of ``paths`` git ignores: what running an example leaves in its folder (a
    model a script wrote, ``.trainflow/``); none where git or the checkout is missing."""
    # A folder's name ends in "/", as git's folder patterns (tiny-bert/) expect.
    names = "\n".join(path.relative_to(REPO).as_posix() + "/" * path.is_dir() for path in paths)
    try:
        found = subprocess.run(
            ["git", "check-ignore", "--stdin"], cwd=REPO, input=names, capture_output=True, text=True
        )
    except OSError:
        return set()
    return {REPO / line.rstrip("/") for line in found.stdout.splitlines()}


def example_title(readme: str) -> str:
    """A README's first heading, or its folder's name."""
    heading = re.search(r"^# (.+)$", readme, flags=re.M)
    return heading[1].strip() if heading else "example"


def example_summary(path: str, page: str) -> str:
    """The overview's section for the example whose README is ``path``, for the page
    ``page`` (its path under docs/): the README's title and first paragraph, its first
    shell block, its files; the README's relative links made relative to ``page``."""
    readme = (REPO / path).read_text()
    folder = posixpath.dirname(path)
    to_repo = posixpath.relpath(".", posixpath.join(DOCS, posixpath.dirname(page)))
    base = posixpath.join(to_repo, folder)

    def rebase(match: re.Match) -> str:
        target = match[2]
        if re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target, re.I):
            return match[0]
        return f"{match[1]}{posixpath.join(base, target)}"

    body = re.sub(r"^# .+\n+", "", readme, count=1, flags=re.M)
    first = LINK.sub(rebase, body.split("\n\n", 1)[0].strip())
    command = re.search(r"^```bash\n.*?^```$", body, flags=re.M | re.S)
    found = [
        file
        for file in sorted((REPO / folder).iterdir())
        if file.name != "README.md" and not file.name.startswith((".", "_"))
    ]
    skipped = ignored(found)
    files = [f"[`{file.name}`]({posixpath.join(base, file.name)})" for file in found if file not in skipped]
    title = example_title(readme)
    return "\n\n".join([
        f"## [{title}]({posixpath.join(base, 'README.md')})",
        first,
        *([command[0]] if command else []),
        f"Files: {', '.join(files)}.",
    ])  # fmt: skip


def on_config(config):
    """Every example's page joins the nav's Examples section, after what the section lists."""
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and EXAMPLES_NAV in entry:
            section = entry[EXAMPLES_NAV]
            listed = {next(iter(item.values())) if isinstance(item, dict) else item for item in section}
            for path in example_pages():
                if path not in listed:
                    section.append({example_title((REPO / path).read_text()): path})
    return config


def on_files(files, config):
    for path in results_pages():
        files.append(File.generated(config, path, content=as_page((REPO / path).read_text())))
    for path in example_pages():
        files.append(File.generated(config, path, content=(REPO / path).read_text()))
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
    if f"{in_repo}/README.md" in copied:  # an example's folder: its page
        in_repo = f"{in_repo}/README.md"
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
    if EXAMPLES_LIST in markdown:
        sections = [example_summary(path, page.file.src_uri) for path in example_pages()]
        markdown = markdown.replace(EXAMPLES_LIST, "\n\n".join(sections))
    copied = copied_pages()

    def relink(match: re.Match) -> str:
        target = repository_link(match[2], page.file.src_uri, copied, config["repo_url"])
        return match[0] if target is None else f"{match[1]}{target}"

    return LINK.sub(relink, markdown)


def on_serve(server, config, builder):
    """``make docs-serve`` rebuilds when a results file or an example changes, as it does
    for a page."""
    for path in (RESULTS.with_suffix(".md"), RESULTS, EXAMPLES):
        server.watch(str(path))
    return server
