"""Screenshots of the documentation site as a reader sees it, in headless Chromium.

Builds the site strictly (a broken link or a name mkdocstrings cannot find fails it), serves
it on 127.0.0.1 on a free port, and has Chromium take a screenshot of the home page and of
the config reference, so that an empty page or a theme that failed to load shows::

    .venv/bin/python docs/screenshots.py            # into a new temporary folder
    .venv/bin/python docs/screenshots.py shots/     # into shots/

It prints each screenshot's path. Chromium comes from Debian's package
(``apt-get install -y chromium``); without it the script says so and exits with code 2.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each screenshot's file name and the page's path on the site.
PAGES = {"home.png": "", "config-reference.png": "reference/config/"}
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WINDOW = (1400, 1600)  # width, height: every screenshot's size in pixels
# Milliseconds of page time Chromium lets pass (scripts, fonts, images) before the screenshot.
TIME_BUDGET_MS = 10_000


def browser() -> str | None:
    """The headless browser's executable, if one is installed."""
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def build(site: Path) -> None:
    """The site, built strictly into ``site``; its errors and warnings end the script."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    built = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"the site did not build (mkdocs build --strict):\n{built.stderr}")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass


@contextmanager
def served(site: Path) -> Iterator[str]:
    """The site's URL while a server on loopback, on a port the system picks, serves it."""
    handler = functools.partial(QuietHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()


def screenshot(executable: str, url: str, png: Path) -> None:
    """``url`` as Chromium renders it, into ``png``, with a profile of its own."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        command = [
            executable,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--virtual-time-budget={TIME_BUDGET_MS}",
            f"--screenshot={png}",
            url,
        ]
        shot = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if shot.returncode != 0 or not png.is_file():
        sys.exit(f"chromium took no screenshot of {url} (exit code {shot.returncode}):\n{shot.stderr}")


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "folder", nargs="?", type=Path, help="where the PNGs go (default: a new temporary folder)"
    )
    args = parser.parse_args(argv)
    executable = browser()
    if executable is None:
        print(f"no headless browser ({', '.join(BROWSERS)}): apt-get install -y chromium", file=sys.stderr)
        sys.exit(2)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="trainflow-screenshots-"))
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trainflow-site-") as site:
        build(Path(site))
        with served(Path(site)) as url:
            shots = []
            for name, page in PAGES.items():
                png = folder.resolve() / name
                screenshot(executable, url + page, png)
                print(png)
                shots.append(png)
    return shots


if __name__ == "__main__":
    main()
