"""`trainflow schedule` and `deploy`: refused in one line before a server is reached or
anything starts."""

from tests.commands import REPO, trainflow


def test_schedule_and_deploy_refuse_to_start_without_a_server(tmp_path):
    scheduled = trainflow("schedule", "--interval", "60", home=tmp_path)
    assert scheduled.returncode == 2 and "schedule needs a Prefect server" in scheduled.stderr
    # A missing config is refused before the server is looked for, naming the file (exit
    # code 2 alone is also what a Click usage error gives).
    missing = trainflow("schedule", "configs/nope.yaml", "--interval", "60", home=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "error: config file configs/nope.yaml: no such file"
    deployed = trainflow("deploy", home=tmp_path)
    assert deployed.returncode == 2 and "deploy needs a Prefect server" in deployed.stderr


def test_schedule_takes_exactly_one_schedule_and_deploy_an_existing_file(monkeypatch, tmp_path):
    """In this process (the refusals come before anything is reached or started): schedule
    with neither or both of --cron and --interval, deploy with a deployments file that is
    not there."""
    from typer.testing import CliRunner

    from trainflow.cli import app

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # a server is named, never asked
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    config = str(REPO / "configs" / "digits.yaml")
    for schedule in ([], ["--cron", "0 2 * * *", "--interval", "60"]):
        out = CliRunner().invoke(app, ["schedule", config, *schedule])
        assert out.exit_code == 2, out.output
        assert out.stderr.strip() == "error: give one schedule: --cron '0 2 * * *' or --interval SECONDS"
    # `serve`, the command's former name, still works for a release and says so in one line.
    out = CliRunner().invoke(app, ["serve", config])
    assert out.exit_code == 2, out.output
    assert out.stderr.strip().splitlines() == [
        "trainflow serve is now trainflow schedule; serve goes in the next release",
        "error: give one schedule: --cron '0 2 * * *' or --interval SECONDS",
    ]
    out = CliRunner().invoke(app, ["deploy", "--prefect-file", str(tmp_path / "nope.yaml")])
    assert out.exit_code == 2, out.output
    assert out.stderr.strip() == (
        f"error: {tmp_path}/nope.yaml: no such file; run trainflow deploy from the trainflow checkout"
    )
