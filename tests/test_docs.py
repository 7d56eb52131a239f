"""The documentation site: built strictly from the repository (a broken link or a name
mkdocstrings cannot find fails it), its references made from the code."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainflow.config.reference import field_docs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert "WARNING" not in built.stderr, built.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_config_reference_shows_every_field_of_the_schema(site):
    page = (site / "reference" / "config" / "index.html").read_text()
    missing = [doc.path for doc in field_docs() if f"<code>{doc.path}</code>" not in page]
    assert missing == []


@pytest.mark.slow
def test_the_command_reference_shows_every_command(site):
    from trainflow.cli.main import click_command

    page = (site / "reference" / "cli" / "index.html").read_text()
    commands = [name for name, command in click_command.commands.items() if not command.hidden]
    assert len(commands) >= 6
    assert [name for name in commands if f"trainflow {name}" not in page] == []
