"""``trainflow run | validate | sweep | predict | schedule | deploy | models``: the command line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from trainflow.config import ConfigError, PipelineConfig, load_config, smoke_config

T = TypeVar("T")

app = typer.Typer(
    help="Train, evaluate and register PyTorch models on Ray, orchestrated by Prefect.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(
    help="Look at registered models, promote and roll back, serve one over HTTP.", no_args_is_help=True
)
app.add_typer(models_app, name="models")

ConfigArg = Annotated[
    Path | None,
    typer.Argument(help="A YAML or JSON config; none runs the bundled digits job (configs/digits.yaml)."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a field: --set train.lr=0.01 (repeatable)."),
]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


SmokeOpt = Annotated[
    bool,
    typer.Option(
        "--smoke",
        help="A quick end-to-end check of the config: a data sample, one epoch, one worker, "
        "registered as NAME-smoke.",
    ),
]


def _config(config: Path | None, overrides: list[str] | None, smoke: bool = False) -> PipelineConfig:
    try:
        cfg = load_config(config, overrides or [])
        return smoke_config(cfg) if smoke else cfg
    except ConfigError as e:
        raise _fail(str(e)) from None


@app.command()
def validate(config: ConfigArg = None, set_: SetOpt = None) -> None:
    """Check a config, its model and its data source without starting Ray or Prefect."""
    from trainflow import checks

    cfg = _config(config, set_)
    with _one_line_errors():
        checks.model_kind(cfg)
        checks.source(cfg)
    typer.echo(f"ok: {cfg.name} (config hash {cfg.config_hash()}), source {cfg.data.source}")


ResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue the latest unfinished training of this config and data (its process died, "
        "or it failed) from its latest checkpoint; without one, start a new training.",
    ),
]


@app.command()
def run(
    config: ConfigArg = None, set_: SetOpt = None, smoke: SmokeOpt = False, resume: ResumeOpt = False
) -> None:
    """Run the training pipeline flow and print a summary."""
    from trainflow import checks, startup
    from trainflow.timeline import timeline

    timeline("command parsed")
    cfg = _config(config, set_, smoke)
    checked = _checked(lambda: checks.before_run(cfg, resume=resume))

    def train():
        from trainflow.flows.training import training_pipeline  # imported by the start-up

        return training_pipeline(config=cfg, resume=resume, checked=checked)

    starting = startup.started(cfg, imports="trainflow.flows.training", warm=checked.warm)
    result = _call_flow("training", starting, train)
    typer.echo("\n".join(["", *_render().summary_lines(result)]))


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="A YAML or JSON config with a sweep section.")],
    set_: SetOpt = None,
    best_config: Annotated[
        Path | None, typer.Option("--best-config", help="Also write the best trial's config here (YAML).")
    ] = None,
) -> None:
    """Run a hyperparameter sweep on Ray Tune and register the best trial's model."""
    from trainflow import checks, startup

    cfg = _config(config, set_)
    checked = _checked(lambda: checks.before_run(cfg, sweep=True))

    def run_sweep():
        from trainflow.flows.sweep import sweep_pipeline  # imported by the start-up

        return sweep_pipeline(config=cfg, checked=checked)

    starting = startup.started(cfg, imports="trainflow.flows.sweep", warm=checked.warm)
    result = _call_flow("sweep", starting, run_sweep)
    if best_config is not None:
        import shutil

        from trainflow.files import replacing_file

        with replacing_file(best_config) as tmp:
            shutil.copyfile(result.best_config_path, tmp)
    typer.echo("\n".join(["", *_render().sweep_lines(result, cfg.sweep.metric, best_config)]))


def _render():
    from trainflow.tasks import render

    return render


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """A check that failed (bad config or data, a cluster too small or out of reach): the
    user fixes it from its message, printed as one line, exit code 2."""
    from trainflow.cluster.checks import PreflightError
    from trainflow.pipelines.data.schema import DataError

    try:
        yield
    except (ConfigError, DataError, PreflightError) as e:
        raise _fail(str(e)) from None


def _checked(check: Callable[[], T]) -> T:
    """What a run's checks found, before Prefect and Ray start; a failed check (bad config
    or data, a cluster too small or out of reach) ends the command in its one line."""
    from trainflow.signals import raise_if_interrupted

    try:
        with _one_line_errors():
            found = check()
        raise_if_interrupted()
    except KeyboardInterrupt as e:
        raise _stopped(e) from None
    return found


def _call_flow(what: str, starting: AbstractContextManager, call: Callable[[], T]) -> T:
    """``call()`` a flow once ``starting`` (a ``startup.started``) is ready. An expected
    failure (see ``tasks.logs``) ends in its one line, exit code 2; any other in one line
    naming the flow, exit code 1 (the flow's logs above hold the traceback)."""
    from trainflow import prefect_server
    from trainflow.signals import sigint_stops_the_run
    from trainflow.timeline import timeline

    try:
        # Ctrl-C ends the run in one line (_stopped), wherever it lands.
        with sigint_stops_the_run(), starting:
            from trainflow.tasks.logs import drop_expected_errors_on_console

            # On the console, a flow's expected failure is this command's one ``error:``
            # line: Prefect's own records of it stay in the run's logs, one line each.
            drop_expected_errors_on_console()
            result = call()
            timeline("flow returned")
    except prefect_server.PrefectServerError as e:
        raise _fail(str(e), code=1) from None
    except (KeyboardInterrupt, SystemExit) as e:
        raise _stopped(e) from None
    except Exception as e:
        from trainflow.tasks.logs import EXPECTED_ERRORS

        if isinstance(e, EXPECTED_ERRORS):
            raise _fail(str(e)) from None
        raise _fail(f"the {what} flow failed: {type(e).__name__}: {e}", code=1) from None
    return result


def _stopped(e: KeyboardInterrupt | SystemExit) -> typer.Exit:
    """A run stopped by Ctrl-C or a stop signal (``signals.stop_on_signals``): one line,
    the shell's exit code for the signal. Prefect's records of the crash stay in the
    run's logs (the flow run ends Crashed) and off this console (``tasks.logs``)."""
    import signal

    code = 128 + signal.SIGINT if isinstance(e, KeyboardInterrupt) else e.code
    try:
        stop = signal.Signals(code - 128)
    except (TypeError, ValueError):  # sys.exit() inside the flow, not a signal
        return _fail(f"the flow ended with sys.exit({code!r})", code=1)
    typer.echo(f"stopped ({stop.name})", err=True)
    return typer.Exit(code)


@app.command()
def predict(
    model: Annotated[str, typer.Argument(help="NAME@ALIAS, NAME/VERSION or models:/NAME@ALIAS")],
    input: Annotated[Path, typer.Argument(help="A Parquet or CSV file, or a folder of them")],
    output: Annotated[Path, typer.Argument(help="A new folder for the Parquet predictions")],
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per batch.")] = 1024,
    concurrency: Annotated[int, typer.Option(min=1, help="Actors, each holding the model once.")] = 1,
    gpu: Annotated[bool, typer.Option("--gpu", help="One GPU per actor.")] = False,
) -> None:
    """Predict every row of INPUT with a registered model; write Parquet to OUTPUT."""
    from trainflow import checks, startup

    # The model (pinned to its version), input, output and cluster, before Prefect and Ray start.
    with _registry_errors():
        checked = _checked(lambda: checks.before_predict(model, str(input), str(output), use_gpu=gpu))
    ref = checked.model

    def run_predict():
        from trainflow.flows.batch_predict import batch_predict  # imported by the start-up

        return batch_predict(
            model=ref.uri, input=str(input), output=str(output), batch_size=batch_size,
            concurrency=concurrency, use_gpu=gpu, checked=checked,
        )  # fmt: skip

    starting = startup.started(ref.cluster(), imports="trainflow.flows.batch_predict", open_registry=False)
    result = _call_flow("batch-predict", starting, run_predict)
    typer.echo(_render().predictions_line(ref.name, result.version, result.rows, str(output), result.seconds))


def _require_server(command: str) -> None:
    """Schedules and deployments live on a Prefect server; the temporary one refuses them."""
    import os

    if not os.environ.get("PREFECT_API_URL"):
        raise _fail(
            f"{command} needs a Prefect server: run `prefect server start` and "
            "export PREFECT_API_URL=http://127.0.0.1:4200/api"
        )


ScheduleConfigArg = Annotated[
    str, typer.Argument(help="The config the scheduled runs use, a path relative to where they run.")
]
NameOpt = Annotated[str, typer.Option(help="The deployment's name.")]
CronOpt = Annotated[str | None, typer.Option(help="A cron schedule, such as '0 2 * * *'.")]
IntervalOpt = Annotated[int | None, typer.Option(help="Seconds between runs.")]


@app.command()
def schedule(
    config: ScheduleConfigArg = "configs/digits.yaml",
    set_: SetOpt = None,
    smoke: SmokeOpt = False,
    name: NameOpt = "scheduled",
    cron: CronOpt = None,
    interval: IntervalOpt = None,
) -> None:
    """Run the training flow on a schedule from this process: no work pool needed.

    Needs a Prefect server (PREFECT_API_URL); runs go on until you stop this command.
    """
    _config(Path(config), set_, smoke)  # refuse a bad config now, not at the first scheduled run
    _require_server("schedule")
    if (cron is None) == (interval is None):
        raise _fail("give one schedule: --cron '0 2 * * *' or --interval SECONDS")

    from trainflow.cluster.quiet import apply_quiet_env
    from trainflow.flows.training import training_pipeline

    apply_quiet_env()
    training_pipeline.serve(
        name=name,
        cron=cron,
        interval=interval,
        parameters={"config": config, "overrides": set_ or [], "smoke": smoke},
        limit=1,
    )


@app.command(hidden=True)
def serve(
    config: ScheduleConfigArg = "configs/digits.yaml",
    set_: SetOpt = None,
    smoke: SmokeOpt = False,
    name: NameOpt = "served",
    cron: CronOpt = None,
    interval: IntervalOpt = None,
) -> None:
    """The former name of `trainflow schedule`; it goes in the next release."""
    typer.echo("trainflow serve is now trainflow schedule; serve goes in the next release", err=True)
    schedule(config, set_, smoke, name, cron, interval)


@app.command()
def deploy(
    prefect_file: Annotated[Path, typer.Option(help="The deployments to create.")] = Path(
        "deployments/prefect.yaml"
    ),
) -> None:
    """Create or update every deployment in deployments/prefect.yaml, from this checkout.

    The same as `prefect deploy --all --prefect-file deployments/prefect.yaml` with
    TRAINFLOW_CHECKOUT (this folder), TRAINFLOW_GIT_URL (origin, else this folder) and
    TRAINFLOW_HOME (default ./.trainflow) set for the deployments' pull steps and runs.
    """
    import os
    import subprocess

    if not prefect_file.is_file():
        raise _fail(f"{prefect_file}: no such file; run trainflow deploy from the trainflow checkout")
    _require_server("deploy")
    prefect = Path(sys.executable).with_name("prefect")
    checkout = Path.cwd()
    origin = subprocess.run(
        ["git", "remote", "get-url", "origin"], cwd=checkout, capture_output=True, text=True
    ).stdout.strip()
    env = {
        **os.environ,
        "TRAINFLOW_CHECKOUT": str(checkout),
        "TRAINFLOW_GIT_URL": os.environ.get("TRAINFLOW_GIT_URL") or origin or str(checkout),
        "TRAINFLOW_HOME": str(Path(os.environ.get("TRAINFLOW_HOME") or checkout / ".trainflow").resolve()),
    }
    cmd = [str(prefect), "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file)]
    raise typer.Exit(subprocess.run(cmd, env=env).returncode)


def _registry():
    """The registry module and the workspace, with MLflow's own logging kept quiet."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    from trainflow.pipelines import registry
    from trainflow.workspace import workspace

    return registry, workspace()


def _registry_errors():
    """One-line errors for unknown models, versions and aliases, and impossible moves."""
    from contextlib import contextmanager

    from mlflow.exceptions import MlflowException

    from trainflow.pipelines.registry import IntegrityError, RegistryError

    @contextmanager
    def handler():
        try:
            yield
        except (RegistryError, IntegrityError) as e:
            raise _fail(str(e)) from None
        except MlflowException as e:
            raise _fail(str(e).splitlines()[0]) from None

    return handler()


ModelArg = Annotated[str, typer.Argument(help="NAME, NAME@ALIAS or NAME/VERSION")]
NameArg = Annotated[str, typer.Argument(help="The registered model's name")]


@models_app.command("list")
def models_list(name: NameArg) -> None:
    """Every version of a model: its aliases, test metrics and gate decision."""
    registry, ws = _registry()
    with _registry_errors():
        versions = registry.version_summaries(ws, name)
    typer.echo("\n".join(_render().versions_lines(versions)))


@models_app.command("show")
def models_show(model: ModelArg) -> None:
    """Show a registered version: its aliases, test metrics, lineage and gate decision."""
    registry, ws = _registry()
    with _registry_errors():
        details = registry.version_details(ws, model)
    typer.echo(_render().version_json(details))


@models_app.command("promote")
def models_promote(
    name: NameArg, version: Annotated[str, typer.Argument(help="The version to promote")]
) -> None:
    """Make VERSION the champion, whatever its gate said; `rollback` undoes it."""
    registry, ws = _registry()
    with _registry_errors():
        move = registry.promote(ws, name, version)
    typer.echo(_render().move_line(name, move))


@models_app.command("rollback")
def models_rollback(name: NameArg) -> None:
    """Move the champion back to the champion before it."""
    registry, ws = _registry()
    with _registry_errors():
        move = registry.rollback(ws, name)
    typer.echo(_render().move_line(name, move))


@models_app.command("serve")
def models_serve(
    model: ModelArg,
    host: Annotated[
        str, typer.Option(help="The address to listen on; 127.0.0.1 keeps it on this machine.")
    ] = ("127.0.0.1"),
    port: Annotated[int, typer.Option(min=1, max=65535, help="The HTTP port.")] = 8000,
    replicas: Annotated[int, typer.Option(min=1, help="Replicas, each holding the model once.")] = 1,
    max_replicas: Annotated[
        int | None,
        typer.Option(min=1, help="Instead of --replicas: from 1 up to this many, as the load asks."),
    ] = None,
    cpus_per_replica: Annotated[float, typer.Option(min=0.01, help="CPUs Ray reserves per replica.")] = 1.0,
) -> None:
    """Serve MODEL over HTTP on Ray Serve until Ctrl-C: POST /predict, GET /model, /docs.

    A model by alias (NAME, NAME@ALIAS) follows the alias as it moves; NAME/VERSION stays.
    """
    _, ws = _registry()
    from trainflow.pipelines import serving

    # The model, the port and the replicas' CPUs are checked here, before Ray starts.
    with _registry_errors(), _one_line_errors():
        if max_replicas is not None and replicas != 1:
            raise ConfigError("give --replicas or --max-replicas, not both")
        application = serving.app(
            model, replicas=replicas, max_replicas=max_replicas, cpus_per_replica=cpus_per_replica, ws=ws
        )
        kind = serving.model_kind(model, ws)
        serving.check_port(host, port)
        if max_replicas is None:
            serving.check_fits(replicas, cpus_per_replica)
        else:
            serving.check_fits(max_replicas, cpus_per_replica, flag="--max-replicas")

    def ready(url: str) -> None:
        typer.echo(
            f"serving {model} at {url} (POST {url}/predict, GET {url}/model, docs {url}/docs); Ctrl-C stops"
        )

    try:
        with _one_line_errors():  # a cluster started elsewhere, checked once connected
            serving.serve_until_stopped(application, host=host, port=port, on_ready=ready, model_kind=kind)
    except KeyboardInterrupt:  # Ctrl-C while Ray was still starting
        raise typer.Exit(130) from None
    typer.echo("stopped")


def _exit_without_teardown(code: int) -> None:
    """End the process as the interpreter would, less its teardown.

    What the interpreter does first is done here: wait for the threads that are not
    daemons, then run every exit hook (Ray's shutdown, the stop of Prefect's server with
    every log and event sent, logging's flush, the timeline's last mark). What it would
    do next, free every module and object of a process that imported torch, Ray, Prefect
    and MLflow, writes nothing and took 1.8-1.9 s at the end of every `trainflow run`
    (benchmarks/results.md, overhead phase by phase: exit to the command's exit). Where
    Python's hooks moved, the process ends the usual way.
    """
    import atexit
    import os
    import threading

    wait_for_threads = getattr(threading, "_shutdown", None)
    run_exit_hooks = getattr(atexit, "_run_exitfuncs", None)
    if wait_for_threads is None or run_exit_hooks is None:
        return
    wait_for_threads()
    run_exit_hooks()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to write to
            pass
    os._exit(code)


def main() -> None:
    import atexit
    import signal

    from trainflow.signals import on_sigint
    from trainflow.timeline import timeline

    atexit.register(timeline, "exit")  # registered first, so it runs after every other exit hook
    signal.signal(signal.SIGINT, on_sigint)  # a Ctrl-C that lands where it is swallowed still stops a run
    try:
        app(prog_name="trainflow")  # ends in SystemExit, as every click command does
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            _exit_without_teardown(e.code or 0)
        raise


if __name__ == "__main__":
    sys.exit(main())
