"""The command-line app: every command's --help, and --version."""

from tests.commands import trainflow


def test_every_commands_summary_in_help_is_one_whole_sentence_an_80_column_terminal_prints_whole():
    """`trainflow --help` and each group's list every command by the first paragraph of its
    help: one line, a sentence ending in a full stop. Rich's list wraps it; Click's plain
    list (TYPER_USE_RICH=0, or typer without rich) cuts it with "..." past the terminal's
    width less the longest command name, so it is held to what fits 80 columns there."""
    import inspect

    from trainflow.cli.main import click_command

    def groups(group, path: str):
        yield path, group
        for name, command in group.commands.items():
            if getattr(command, "commands", None) is not None:
                yield from groups(command, f"{path} {name}")

    found = {}
    for path, group in groups(click_command, "trainflow"):
        # Click's own width at an 80-column terminal: 78.
        ctx = group.make_context(path, [], resilient_parsing=True, terminal_width=78)
        plain = ctx.make_formatter()
        group.format_commands(ctx, plain)
        listed = dict(line.strip().split(maxsplit=1) for line in plain.getvalue().splitlines()[1:])
        for name, command in group.commands.items():
            if command.hidden:
                continue
            first = inspect.cleandoc(command.help or "").split("\n\n")[0]
            found[f"{path} {name}"] = first
            assert "\n" not in first and first.endswith("."), f"{path} {name}: {first!r}"
            assert listed[name] == first, f"{path} {name}: --help lists {listed[name]!r}"
    assert {"trainflow run", "trainflow ui", "trainflow models promote", "trainflow stack up"} <= set(found)


def test_no_help_shows_a_flag_as_taking_a_value():
    """Every command's --help, as a terminal shows it: a flag (--help, --smoke, --force, ...)
    is listed bare, never as taking a ``<bool>``."""
    from typer.testing import CliRunner

    from trainflow.cli import app
    from trainflow.cli.main import click_command

    def paths(command, path: list[str]):
        yield path
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from paths(sub, [*path, name])

    helped = 0
    for path in paths(click_command, []):
        out = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
        assert out.exit_code == 0, (path, out.output)
        assert "<bool>" not in out.output, (path, out.output)
        helped += 1
    assert helped > 20


def test_version_prints_the_release(tmp_path):
    from trainflow.version import __version__

    out = trainflow("--version", home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"trainflow {__version__}\n"
