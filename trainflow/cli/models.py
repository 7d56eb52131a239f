"""``trainflow models list | show | promote | rollback | serve``: the registry's models, their
champion, and a model served over HTTP."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from trainflow.cli.root import fail, models_app, one_line_errors, render
from trainflow.config import ConfigError


def _registry():
    """The registry's ``versions`` module (which also shows it, torch-free, unlike
    ``tasks.render``) and the workspace, with MLflow's own logging kept quiet and its
    telemetry off, as in a run."""
    from trainflow.cluster.quiet import apply_quiet_env

    apply_quiet_env()
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    from trainflow.pipelines.registry import versions
    from trainflow.workspace import workspace

    return versions, workspace()


def registry_errors():
    """One-line errors for unknown models, versions and aliases, and impossible moves."""
    from contextlib import contextmanager

    from mlflow.exceptions import MlflowException

    from trainflow.pipelines.registry.lineage import IntegrityError
    from trainflow.pipelines.registry.versions import RegistryError

    @contextmanager
    def handler():
        try:
            yield
        except (RegistryError, IntegrityError) as e:
            raise fail(str(e)) from None
        except MlflowException as e:
            raise fail(str(e).splitlines()[0]) from None

    return handler()


ModelArg = Annotated[str, typer.Argument(help="NAME, NAME@ALIAS or NAME/VERSION")]


NameArg = Annotated[str, typer.Argument(help="The registered model's name")]


@models_app.command("list")
def models_list(
    name: Annotated[
        str | None, typer.Argument(help="A registered model's name; none lists every model.")
    ] = None,
) -> None:
    """List the registered models, or one model's versions.

    With no NAME: each model's champion and latest version. With NAME: its versions,
    their aliases, test metrics and gate decision."""
    versions, ws = _registry()
    with registry_errors():
        if name is None:
            lines = versions.models_lines(versions.model_summaries(ws))
        else:
            lines = versions.versions_lines(versions.version_summaries(ws, name))
    typer.echo("\n".join(lines))


@models_app.command("show")
def models_show(model: ModelArg) -> None:
    """Show a version: aliases, test metrics, lineage, gate decision."""
    versions, ws = _registry()
    with registry_errors():
        details = versions.version_details(ws, model)
    typer.echo(versions.version_json(details))


@models_app.command("promote")
def models_promote(
    name: NameArg,
    version: Annotated[str, typer.Argument(help="The version to promote")],
    min_agreement: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Only if, shadowed beside the champion (serve --shadow), its classes agreed on at least "
            "this share of rows.",
        ),
    ] = None,
    feedback_win: Annotated[
        bool,
        typer.Option(
            "--feedback-win",
            help="Only if, shadowed beside the champion, it scored better on the labelled feedback "
            "(POST /feedback).",
        ),
    ] = False,
) -> None:
    """Make VERSION the champion, whatever its gate said.

    `rollback` undoes it. With --min-agreement or --feedback-win, only if its shadow
    comparison with the champion shows it."""
    versions, ws = _registry()
    reason = "promoted by hand"
    with registry_errors(), one_line_errors():
        if min_agreement is not None or feedback_win:
            from trainflow.pipelines.serving.shadow import require_shadow

            champion = str(versions.resolve(ws, f"{name}@champion").version)
            found = require_shadow(
                ws, name, champion, version, min_agreement=min_agreement, feedback_win=feedback_win
            )
            reason = f"promoted by hand, {found}"
            typer.echo(f"{name} version {version}: {found}")
        move = versions.promote(ws, name, version, reason=reason)
    typer.echo(versions.move_line(name, move))


@models_app.command("rollback")
def models_rollback(name: NameArg) -> None:
    """Move the champion back to the champion before it."""
    versions, ws = _registry()
    with registry_errors():
        move = versions.rollback(ws, name)
    typer.echo(versions.move_line(name, move))


ShadowOpt = Annotated[
    str | None,
    typer.Option(
        help="An alias (challenger) or version of the model that also answers every request, off "
        "the answer's path: GET /shadow compares the two, POST /feedback scores them.",
    ),
]


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
    shadow: ShadowOpt = None,
) -> None:
    """Serve MODEL over HTTP on Ray Serve until Ctrl-C.

    POST /predict, GET /model, /docs. A model by alias (NAME, NAME@ALIAS) follows the alias
    as it moves; NAME/VERSION stays.
    """
    _, ws = _registry()
    from trainflow.pipelines import serving

    # The model, the port and the replicas' CPUs are checked here, before Ray starts.
    with registry_errors(), one_line_errors():
        if max_replicas is not None and replicas != 1:
            raise ConfigError("give --replicas or --max-replicas, not both")
        application = serving.app(
            model,
            replicas=replicas,
            max_replicas=max_replicas,
            cpus_per_replica=cpus_per_replica,
            ws=ws,
            shadow=shadow,
        )
        kind = serving.model_kind(model, ws)
        serving.check_port(host, port)
        if max_replicas is None:
            serving.check_fits(replicas + bool(shadow), cpus_per_replica)
        else:
            serving.check_fits(max_replicas + bool(shadow), cpus_per_replica, flag="--max-replicas")

    def ready(url: str) -> None:
        also = f", GET {url}/shadow beside {shadow}" if shadow else ""
        typer.echo(
            f"serving {model} at {url} (POST {url}/predict, GET {url}/model{also}, docs {url}/docs); "
            "Ctrl-C stops"
        )

    try:
        with one_line_errors():  # a cluster started elsewhere, checked once connected
            one = replicas == 1 and max_replicas is None
            serving.serve_until_stopped(
                application, host=host, port=port, on_ready=ready, model_kind=kind, one_replica=one
            )
    except KeyboardInterrupt:  # Ctrl-C while Ray was still starting
        raise typer.Exit(130) from None
    typer.echo("stopped")


@models_app.command("reproduce")
def models_reproduce(
    model: Annotated[str, typer.Argument(help="NAME/VERSION: the version to train again")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Reproduce it although its data or the code's git commit has changed since."
        ),
    ] = False,
) -> None:
    """Train a version again on its exact config; compare its metrics.

    The new version is registered tagged reproduces=VERSION, each test metric printed
    beside the version's. Refused in one line, before Ray starts, when the data's
    fingerprint or the code's git commit differs from the version's lineage, unless --force.
    """
    from trainflow import run_checks
    from trainflow.cli.root import runtime_errors
    from trainflow.runtime import Command

    _registry()
    command = Command(
        "reproduce",
        "reproduce-" + model.removeprefix("models:/").replace("/", "-v"),
        imports="trainflow.flows.reproduce",
        model=model,
    )
    with runtime_errors(), command:
        found = command.check(lambda: run_checks.before_reproduce(model, force=force))
        for change in found.changed:
            typer.secho(f"warning: reproducing {found.original.ref} although {change}", err=True)

        def reproduce():
            from trainflow.flows.reproduce import reproduce_version  # imported by the start-up

            return reproduce_version(model=found.original.ref, force=force, checked=found.run)

        result = command.call(reproduce, cluster=found.original.config, warm=found.run.warm)
    typer.echo("\n".join(["", *render().reproduce_lines(result)]))


def _drift_default(field: str):
    from trainflow.config import DriftConfig

    return DriftConfig.model_fields[field].default


@models_app.command("drift")
def models_drift(
    name: NameArg,
    psi: Annotated[
        float, typer.Option(help="A feature drifted at this population stability index or above.")
    ] = _drift_default("psi"),
    ks_pvalue: Annotated[
        float, typer.Option("--ks-pvalue", help="A number drifted too when its KS p-value is below this.")
    ] = _drift_default("ks_pvalue"),
    check: Annotated[bool, typer.Option("--check", help="Exit with 1 when a feature drifted.")] = False,
) -> None:
    """Score a served model's requests for drift from its train data.

    What it was asked, against its champion's train split: each feature's PSI and KS test,
    from the sample of requests each replica of `trainflow models serve` keeps under
    serving/NAME/ of the model's storage, else of TRAINFLOW_HOME."""
    from trainflow.pipelines.drift.samples import served_drift

    _, ws = _registry()
    with registry_errors(), one_line_errors():
        report, sampled = served_drift(ws, name, psi_threshold=psi, ks_pvalue=ks_pvalue)
    typer.echo("\n".join(render().drift_lines(report.summary(), report.rows(), sampled)))
    if check and report.drifted:
        raise typer.Exit(1)
