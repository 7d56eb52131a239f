"""The ``trainflow`` command: ``run``, ``validate``, ``sweep``, ``predict``, ``schedule``,
``deploy``, ``models`` and ``ui``, a module each by what it does (``run_commands``, ``scheduling``,
``models``, ``ui``), on one Typer app (``app``)."""

from trainflow.cli.app import app
from trainflow.cli.main import main

__all__ = ["app", "main"]
