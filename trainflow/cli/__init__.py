"""The ``trainflow`` command: ``run``, ``validate``, ``sweep``, ``predict``, ``schedule``,
``deploy``, ``models`` and ``ui``, a module each by what it does (``run_commands``, ``scheduling``,
``models``, ``ui``), on one Typer app (``app``, made in ``root``).

``app`` is imported on first use: the command hands a ``run``, ``sweep`` or ``predict`` to
``trainflow up``'s forkserver before it imports Typer, pydantic or the config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainflow.cli.main import main

if TYPE_CHECKING:
    from trainflow.cli.root import app

__all__ = ["app", "main"]


def __getattr__(name: str):
    if name == "app":
        from trainflow.cli.main import commands

        return commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
