"""``trainflow run | validate | predict | models``: the command line."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from trainflow.config import ConfigError, PipelineConfig, load_config, smoke_config

app = typer.Typer(
    help="Train, evaluate and register PyTorch models on Ray, orchestrated by Prefect.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Look at registered models, promote and roll back.", no_args_is_help=True)
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


def _check_source(cfg: PipelineConfig):
    """The source's SourceInfo, or the command fails in one line naming what is wrong."""
    from trainflow.pipelines.data import DataError, inspect_source

    try:
        return inspect_source(cfg.data)
    except (DataError, ConfigError) as e:
        raise _fail(str(e)) from None


@app.command()
def validate(config: ConfigArg = None, set_: SetOpt = None) -> None:
    """Check a config and its data source without starting Ray or Prefect."""
    cfg = _config(config, set_)
    _check_source(cfg)
    typer.echo(f"ok: {cfg.name} (config hash {cfg.config_hash()}), source {cfg.data.source}")


@app.command()
def run(config: ConfigArg = None, set_: SetOpt = None, smoke: SmokeOpt = False) -> None:
    """Run the training pipeline flow and print a summary."""
    from trainflow.runtime import timeline

    timeline("command parsed")
    cfg = _config(config, set_, smoke)
    warm = _check_before_start(cfg)
    result = _run_flow(cfg, "trainflow.flows.training", "training_pipeline", "training", warm)

    reg = result.registered
    lines = [
        "",
        *_registered_lines(reg, result.test_metrics),
        f"checkpoint  {result.checkpoint}",
        _steps_line(result.timings),
        f'load it     trainflow.load_model("{reg.name}@champion") or "{reg.name}/{reg.version}"',
    ]
    if result.cached:
        lines.insert(
            5, f"cache       {', '.join(result.cached)} skipped: same data and config as an earlier run"
        )
    elif result.prepared_reused:
        lines.insert(5, "cache       prepared splits reused (same data, split and preprocessing)")
    typer.echo("\n".join(lines))


def _cli_logger() -> logging.Logger:
    """INFO lines of the command itself on stderr, in the look of Prefect's."""
    logger = logging.getLogger("trainflow.cli")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s.%(msecs)03d | %(levelname)-7s | trainflow - %(message)s", "%H:%M:%S"
            )
        )
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def _check_before_start(cfg: PipelineConfig, sweep: bool = False) -> tuple[str, ...]:
    """What can fail before Prefect and Ray start, in one line: the data source, what the
    run asks of the local cluster it would start (GPUs, CPUs), or a cluster address where
    nothing answers. Returns the modules the Ray workers that prepare its data import
    (none when it is prepared in this process)."""
    from trainflow.pipelines.prepare import worker_modules
    from trainflow.runtime import PreflightError, check_reachable, preflight_local, ray_address, timeline

    source = _check_source(cfg)
    try:
        if ray_address(cfg):
            check_reachable(ray_address(cfg))  # a cluster elsewhere: is anything there?
        else:
            preflight_local(cfg, sweep=sweep)
    except PreflightError as e:
        raise _fail(str(e)) from None
    timeline("config, source and resources checked")
    return worker_modules(source)


def _run_flow(cfg: PipelineConfig, module: str, flow_name: str, what: str, warm: tuple[str, ...]):
    """Start what the flow needs, overlapped, then call it: Prefect's temporary server
    first (when no server is configured), so that its start-up does not wait behind Ray
    and torch for the CPU; then the flow's imports (torch) and the MLflow store in
    threads while this thread starts Ray. Expected errors end in one line."""
    import warnings

    from trainflow import prefect_server
    from trainflow.runtime import apply_quiet_env, ray_session, timeline

    apply_quiet_env()
    # MLflow hides this pydantic warning in warnings.catch_warnings(), which is not
    # thread-safe: imported beside other threads, it leaks through now and then.
    warnings.filterwarnings("ignore", message=r'Field name "schema" in "JsonSchemaSpec" shadows')
    with _prefect_api() as server:
        timeline("prefect server started" if server else "prefect server configured")
        store = _Background("mlflow-store", _open_registry)
        flow = _Background("import-flow", lambda: importlib.import_module(module))
        try:
            # before the flow, so that its logs follow the line with Ray's address; what
            # the run asks of a local cluster was checked before anything started
            with ray_session(cfg, _cli_logger(), workers=None, warm=warm):
                timeline("ray started")
                flow.wait()
                timeline("flow imported")
                if server is not None:
                    server.wait()
                    timeline("prefect server answered")
                store.wait()
                timeline("mlflow store open")
                _one_line_expected_errors()
                result = getattr(sys.modules[module], flow_name)(config=cfg)
                timeline("flow returned")
            timeline("ray shut down")
        except prefect_server.PrefectServerError as e:
            raise _fail(str(e), code=1) from None
        except Exception as e:
            if _expected(e):
                raise _fail(str(e)) from None
            # the flow's logs above hold the traceback
            raise _fail(f"the {what} flow failed: {type(e).__name__}: {e}", code=1) from None
    timeline("prefect server stopped")
    return result


@contextmanager
def _prefect_api() -> Iterator:
    """Prefect's temporary server for this command, started now, when no server is
    configured (PREFECT_API_URL or a profile); yields it (None: a configured server)."""
    from trainflow import prefect_server
    from trainflow.runtime import workspace

    if prefect_server.configured_api_url() is not None:
        yield None
        return
    with prefect_server.TemporaryServer(workspace().home / "prefect-server.log") as server:
        yield server


def _expected(error: BaseException) -> bool:
    """A failure the user fixes from its message (bad config or data, a cluster too
    small, no sweep trial that worked): one line, exit code 2."""
    from trainflow.flows.logs import EXPECTED_ERRORS

    return isinstance(error, EXPECTED_ERRORS)


def _one_line_expected_errors() -> None:
    """On the console, a flow's expected failure (bad data, a config or preflight error)
    is this command's one ``error:`` line: Prefect's own records of it (the task's and the
    flow's failure, with tracebacks) stay in the run's logs on the server, one line each."""
    from trainflow.flows.logs import drop_expected_errors_on_console

    drop_expected_errors_on_console()


class _Background:
    """A start-up step in a thread of its own; ``wait()`` joins it and raises its error."""

    def __init__(self, name: str, fn) -> None:
        import threading

        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            fn()
        except BaseException as e:  # handed to the caller by wait()
            self.error = e

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def _open_registry() -> None:
    """Open the registry's store once: MLflow's imports, and on a new TRAINFLOW_HOME the
    embedded database's tables, are then ready when the register step runs."""
    registry, ws = _registry()
    registry.client(ws)


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="A YAML or JSON config with a sweep section.")],
    set_: SetOpt = None,
    best_config: Annotated[
        Path | None, typer.Option("--best-config", help="Also write the best trial's config here (YAML).")
    ] = None,
) -> None:
    """Run a hyperparameter sweep on Ray Tune and register the best trial's model."""
    cfg = _config(config, set_)
    if cfg.sweep is None:
        raise _fail(
            f"{config} has no sweep section; add one such as "
            "sweep: {space: {train.lr: {loguniform: [0.0001, 0.1]}}, trials: 8}"
        )
    warm = _check_before_start(cfg, sweep=True)
    result = _run_flow(cfg, "trainflow.flows.sweep", "sweep_pipeline", "sweep", warm)
    if best_config is not None:
        import shutil

        from trainflow.files import replacing_file

        with replacing_file(best_config) as tmp:
            shutil.copyfile(result.best_config_path, tmp)

    metric = cfg.sweep.metric
    header = ("trial", "status", "epochs", metric, "params")
    rows = [
        (
            t["trial_id"],
            t["status"],
            f"{t['epochs']}/{t['max_epochs']}",
            "-" if t["best"] is None else f"{t['best']:.4f}",
            ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["params"].items()),
        )
        for t in result.trials
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [""] + [
        "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    ]
    lines += [f"failed      {t['trial_id']}: {t['error']}" for t in result.trials if t["status"] == "failed"]
    lines += [
        "",
        f"best        trial {result.best_trial}; its config: {result.best_config_path}"
        + (f" (and {best_config})" if best_config else ""),
        *_registered_lines(result.registered, result.test_metrics),
        f"concurrency {result.max_concurrent} trials at a time",
        _steps_line(result.timings),
    ]
    typer.echo("\n".join(lines))


def _registered_lines(reg, test_metrics: dict[str, float]) -> list[str]:
    """The summary's model, gate and test lines for a registered version."""
    return [
        f"model       {reg.name} version {reg.version}"
        + (" -> champion" if reg.champion else " -> challenger (champion unchanged)"),
        f"gate        {reg.decision['reason']}",
        "test        " + ", ".join(f"{k} {v:.4f}" for k, v in test_metrics.items()),
    ]


def _steps_line(timings: dict[str, float]) -> str:
    return (
        "steps       "
        + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
        + f" (total {sum(timings.values()):.1f}s)"
    )


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
    from mlflow.exceptions import MlflowException

    from trainflow.pipelines.data import DataError
    from trainflow.pipelines.predict import check_output, inspect_input
    from trainflow.runtime import PreflightError, apply_quiet_env

    registry, ws = _registry()
    # Model, input and output are checked here, before Prefect and Ray start.
    with _registry_errors():
        mv = registry.resolve(ws, model)
        features = registry.load_model(f"{mv.name}/{mv.version}", ws).preprocessor.input_columns
    try:
        inspect_input(str(input), features)
        check_output(str(output))
    except DataError as e:
        raise _fail(str(e)) from None

    apply_quiet_env()
    from trainflow import prefect_server

    try:
        with _prefect_api() as server:
            from trainflow.flows.batch_predict import batch_predict

            if server is not None:
                server.wait()
            _one_line_expected_errors()
            result = batch_predict(
                model=f"{mv.name}/{mv.version}",
                input=str(input),
                output=str(output),
                batch_size=batch_size,
                concurrency=concurrency,
                use_gpu=gpu,
            )
    except prefect_server.PrefectServerError as e:
        raise _fail(str(e), code=1) from None
    except (DataError, PreflightError, MlflowException) as e:
        raise _fail(str(e)) from None
    except Exception as e:  # the flow's logs above hold the traceback
        raise _fail(f"the batch-predict flow failed: {type(e).__name__}: {e}", code=1) from None
    typer.echo(
        f"{result.rows} predictions of {mv.name} v{result.version} in {output} ({result.seconds:.1f}s)"
    )


def _require_server(command: str) -> None:
    """Schedules and deployments live on a Prefect server; the temporary one refuses them."""
    import os

    if not os.environ.get("PREFECT_API_URL"):
        raise _fail(
            f"{command} needs a Prefect server: run `prefect server start` and "
            "export PREFECT_API_URL=http://127.0.0.1:4200/api"
        )


@app.command()
def serve(
    config: Annotated[
        str,
        typer.Argument(help="The config the scheduled runs use, a path relative to where they run."),
    ] = "configs/digits.yaml",
    set_: SetOpt = None,
    smoke: SmokeOpt = False,
    name: Annotated[str, typer.Option(help="The deployment's name.")] = "served",
    cron: Annotated[str | None, typer.Option(help="A cron schedule, such as '0 2 * * *'.")] = None,
    interval: Annotated[int | None, typer.Option(help="Seconds between runs.")] = None,
) -> None:
    """Serve the training flow on a schedule from this process: no work pool needed.

    Needs a Prefect server (PREFECT_API_URL); runs go on until you stop this command.
    """
    _config(Path(config), set_, smoke)  # refuse a bad config now, not at the first scheduled run
    _require_server("serve")
    if (cron is None) == (interval is None):
        raise _fail("give one schedule: --cron '0 2 * * *' or --interval SECONDS")

    from trainflow.flows.training import training_pipeline
    from trainflow.runtime import apply_quiet_env

    apply_quiet_env()
    training_pipeline.serve(
        name=name,
        cron=cron,
        interval=interval,
        parameters={"config": config, "overrides": set_ or [], "smoke": smoke},
        limit=1,
    )


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
    from trainflow.runtime import workspace

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
        versions = registry.list_versions(ws, name)
        c = registry.client(ws)
        # Searched versions come without their aliases; the registered model holds them.
        aliases: dict[str, list[str]] = {}
        for alias, version in c.get_registered_model(name).aliases.items():
            aliases.setdefault(str(version), []).append(alias)
        rows = []
        for mv in versions:
            metrics = c.get_run(mv.run_id).data.metrics if mv.run_id else {}
            rows.append(
                (
                    str(mv.version),
                    ",".join(sorted(aliases.get(str(mv.version), []))) or "-",
                    f"{metrics['test_accuracy']:.4f}" if "test_accuracy" in metrics else "-",
                    f"{metrics['test_macro_f1']:.4f}" if "test_macro_f1" in metrics else "-",
                    {"True": "passed", "False": "failed"}.get(mv.tags.get("gate.passed", ""), "-"),
                    time.strftime("%Y-%m-%d %H:%M", time.gmtime(mv.creation_timestamp / 1000)),
                )
            )
    header = ("version", "aliases", "accuracy", "macro_f1", "gate", "created (UTC)")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


@models_app.command("show")
def models_show(model: ModelArg) -> None:
    """Show a registered version: its aliases, test metrics, lineage and gate decision."""
    registry, ws = _registry()
    with _registry_errors():
        mv = registry.resolve(ws, model)
        c = registry.client(ws)
        run = c.get_run(mv.run_id)
        history = [m for m in registry.moves(c, mv.name) if m["version"] == str(mv.version)]
    tags = dict(mv.tags)
    gate = {k.removeprefix("gate."): v for k, v in tags.items() if k.startswith("gate.")}
    typer.echo(
        json.dumps(
            {
                "name": mv.name,
                "version": str(mv.version),
                "status": mv.status,
                "aliases": sorted(mv.aliases),
                "source": mv.source,
                "metrics": {k: v for k, v in run.data.metrics.items() if k.startswith("test_")},
                "gate": gate,
                "alias_moves": history,
                "tags": tags,
            },
            indent=2,
        )
    )


@models_app.command("promote")
def models_promote(
    name: NameArg, version: Annotated[str, typer.Argument(help="The version to promote")]
) -> None:
    """Make VERSION the champion, whatever its gate said; `rollback` undoes it."""
    registry, ws = _registry()
    with _registry_errors():
        move = registry.promote(ws, name, version)
    was = f" (was v{move['previous']})" if move["previous"] else ""
    typer.echo(f"{name}: champion -> v{move['version']}{was}")


@models_app.command("rollback")
def models_rollback(name: NameArg) -> None:
    """Move the champion back to the champion before it."""
    registry, ws = _registry()
    with _registry_errors():
        move = registry.rollback(ws, name)
    typer.echo(f"{name}: champion -> v{move['version']} (rolled back from v{move['previous']})")


def main() -> None:
    import atexit

    from trainflow.runtime import timeline

    atexit.register(timeline, "exit")  # registered first, so it runs after every other exit hook
    app(prog_name="trainflow")


if __name__ == "__main__":
    sys.exit(main())
