"""Results rendered for people: the command's text (the run summary, the sweep's trial
table) and Prefect's artifacts (markdown and tables), each from the result models of
:mod:`trainflow.tasks.results` and the registry; `trainflow models`' listings are in
:mod:`trainflow.pipelines.registry.versions`, which imports no torch.

Nothing here computes or fetches: callers hand over what they got, this shapes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainflow.config import headline_metrics
from trainflow.pipelines.evaluation import reports
from trainflow.tasks.results import Evaluated, PipelineResult, Registered, Reproduced, SweepResult

if TYPE_CHECKING:
    from trainflow.pipelines.registry import registration

# The summary's labels are padded to one width so that the values line up.
_LABEL = 12


def artifact_key(name: str) -> str:
    # Prefect artifact keys hold lowercase letters, digits and dashes only.
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower())


def _line(label: str, value: str) -> str:
    return f"{label:<{_LABEL}}{value}"


def _metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def test_scores(metrics: dict[str, Any]) -> str:
    """``accuracy 0.9667, macro_f1 0.9650, weighted_f1 0.9662, top2 0.9944``: every number
    of a test split's metrics, the user's own (evaluation.metrics) after the objective's."""
    return _metrics({k: v for k, v in metrics.items() if isinstance(v, float)})


def lead_metric(metrics: dict[str, float]) -> str:
    """``accuracy 0.9667`` or ``rmse 53.2101``: the objective's first metric, for one-line summaries."""
    name = headline_metrics(metrics)[0]
    return f"{name} {metrics[name]:.4f}"


EPOCH_KEYS = ("train_loss", "val_loss", "val_accuracy")


def epoch_metrics(row: dict[str, Any]) -> str:
    """``train_loss 0.3120  val_loss 0.2981  val_accuracy 0.9410  val_top2 0.9800``: an
    epoch's metrics that its objective reports (a regression has no accuracy), then the
    user's own (evaluation.metrics, as val_<name>)."""
    own = [k for k, v in row.items() if k.startswith("val_") and k not in EPOCH_KEYS and _number(v)]
    return "  ".join(f"{k} {row[k]:.4f}" for k in [*(k for k in EPOCH_KEYS if k in row), *own])


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- the run summary -----------------------------------------------------------------


def registered_lines(reg: Registered, test_metrics: dict[str, float]) -> list[str]:
    """The summary's model, gate and test lines for a registered version."""
    moved = " -> champion" if reg.champion else " -> challenger (champion unchanged)"
    return [
        _line("model", f"{reg.name} version {reg.version}{moved}"),
        _line("gate", reg.decision["reason"]),
        _line("test", _metrics(test_metrics)),
    ]


def steps_line(timings: dict[str, float], wall_s: float | None = None) -> str:
    """Each step's seconds and their total; with ``wall_s``, the command's own (its start-up too)."""
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
    wall = "" if wall_s is None else f"; {wall_s:.1f}s with start-up"
    return _line("steps", f"{steps} (total {sum(timings.values()):.1f}s{wall})")


def summary_lines(r: PipelineResult, wall_s: float | None = None) -> list[str]:
    """What ``trainflow run`` prints when the run is done; ``wall_s``: the command's seconds so far."""
    reg = r.registered
    lines = [*registered_lines(reg, r.test_metrics), _line("checkpoint", r.checkpoint)]
    if r.cached:
        lines.append(_line("cache", f"{', '.join(r.cached)} skipped: same data and config as an earlier run"))
    elif r.prepared_reused:
        lines.append(_line("cache", "prepared splits reused (same data, split and preprocessing)"))
    return [
        *lines,
        steps_line(r.timings, wall_s),
        _line("load it", _load_it(reg)),
    ]


def _load_it(reg) -> str:
    """How to load the version just registered: by the champion alias only when it is the champion."""
    pinned = f'"{reg.name}/{reg.version}"'
    if reg.champion:
        return f'trainflow.load_model("{reg.name}@champion") or {pinned}'
    return f"trainflow.load_model({pinned})"


def summary_line(r: PipelineResult | SweepResult) -> str:
    """The run in one line, for the flow's last log line."""
    reg = r.registered
    return (
        f"{reg.name} v{reg.version} test {lead_metric(r.test_metrics)}, "
        f"{'now champion' if reg.champion else 'champion unchanged'}"
    )


def summary_markdown(r: PipelineResult) -> str:
    reg = r.registered
    rows = "\n".join(f"| {step} | {seconds:.1f} |" for step, seconds in r.timings.items())
    metrics = "\n".join(f"| {k} | {v:.4f} |" for k, v in r.test_metrics.items())
    return (
        f"# {reg.name} version {reg.version}\n\n"
        f"{'Promoted to **champion**' if reg.champion else 'Champion unchanged'}: "
        f"{reg.decision['reason']}\n\n"
        f"| test metric | value |\n|---|---|\n{metrics}\n\n"
        f"| step | seconds |\n|---|---|\n{rows}\n\n"
        f"Config hash `{r.config_hash}`; checkpoint `{r.checkpoint}`"
        f"{'; prepared splits reused from the cache' if r.prepared_reused else ''}"
        f"{'; cached steps: ' + ', '.join(r.cached) if r.cached else ''}.\n"
    )


# --- the gate and the test report ----------------------------------------------------


def gate_markdown(reg: registration.Registration) -> str:
    d = reg.decision
    if d.champion is None:
        champion = "none"
    else:
        where = "re-evaluated on this test data" if d.champion_reevaluated else "as registered"
        champion = f"{d.champion:.4f} (v{d.champion_version}, {where})"
    same = {True: "yes", False: "no", None: "-"}[d.same_test_data]
    verdict = "promoted to **champion**" if reg.champion else "not promoted: **challenger**"
    return (
        f"# {reg.name} v{reg.version}: {verdict}\n\n"
        f"{d.reason}\n\n"
        "| metric | candidate | champion | same test data | min_improvement | min_value | passed |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {d.metric} | {d.candidate:.4f} | {champion} | {same} | {d.min_improvement} | "
        f"{d.min_value} | {d.passed} |\n\n"
        f"Aliases: {', '.join(reg.aliases) or 'none'}. "
        f'Load it: `trainflow.load_model("{reg.name}/{reg.version}")`'
    )


def evaluation_markdown(name: str, metrics: dict[str, Any], plots: Sequence[Path | str] = ()) -> str:
    scalars = [(k, v) for k, v in metrics.items() if isinstance(v, float)]
    lines = [
        f"# {name}: test metrics",
        "",
        f"{metrics['num_examples']} examples",
        "",
        "| metric | value |",
        "|---|---|",
        *[f"| {k} | {v:.4f} |" for k, v in scalars],
    ]
    if "per_class" in metrics:
        lines += _classes_markdown(metrics)
    for plot in map(Path, plots):
        # Embedded, so the artifact shows the plot wherever the Prefect UI runs; the
        # file is also logged with the model version's MLflow run under reports/.
        lines += ["", f"![{plot.stem}]({reports.data_uri(plot)})", "", f"`{plot}`"]
    return "\n".join(lines)


def _classes_markdown(metrics: dict[str, Any]) -> list[str]:
    """A classifier's per-class numbers and confusion matrix."""
    classes = list(metrics["per_class"])
    lines = [
        "",
        "## Per class",
        "",
        "| class | precision | recall | f1 | support |",
        "|---|---|---|---|---|",
        *[
            f"| {c} | {v['precision']:.4f} | {v['recall']:.4f} | {v['f1']:.4f} | {v['support']} |"
            for c, v in metrics["per_class"].items()
        ],
        "",
        "## Confusion matrix (rows: true class, columns: predicted)",
        "",
        "| | " + " | ".join(classes) + " |",
        "|---" * (len(classes) + 1) + "|",
    ]
    for c, row in zip(classes, metrics["confusion_matrix"], strict=True):
        lines.append(f"| **{c}** | " + " | ".join(str(v) for v in row) + " |")
    return lines


def per_class_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-class test metrics as a Prefect table artifact's rows (none for a regression)."""
    return [{"class": c, **v} for c, v in metrics.get("per_class", {}).items()]


def gate_report_markdown(reg: registration.Registration, name: str, evaluated: Evaluated) -> str:
    """The whole report in one place: the gate's decision, then the test metrics and plots."""
    return gate_markdown(reg) + "\n\n" + evaluation_markdown(name, evaluated.metrics, evaluated.reports)


# --- drift ---------------------------------------------------------------------------

# The drift artifact's table shows this many features, the drifted and highest PSI first.
DRIFT_ROWS = 50


def drift_markdown(name: str, summary: str, rows: Sequence[dict[str, Any]], plot: Path | str | None) -> str:
    """The drift step's report: its line, the table of features and the plot."""
    lines = [f"# {name}: drift of the new train split", "", drift_table(summary, rows)]
    if plot is not None:
        lines += ["", f"![drift]({reports.data_uri(plot)})", "", f"`{plot}`"]
    return "\n".join(lines)


def drift_table(summary: str, rows: Sequence[dict[str, Any]]) -> str:
    """Drift's line and its table of features (at most DRIFT_ROWS), in Markdown: also
    what a model card says of drift at training time."""
    shown = list(rows)[:DRIFT_ROWS]
    lines = [
        summary,
        "",
        "| feature | kind | psi | ks | p-value | drifted | note |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {r['feature']} | {r['kind']} | {r['psi']:.4f} | {_or_dash(r['ks'])} | "
            f"{_or_dash(r['p_value'])} | {'**yes**' if r['drifted'] else 'no'} | {r['note']} |"
            for r in shown
        ],
    ]
    if len(rows) > len(shown):
        lines += ["", f"{len(rows) - len(shown)} more features, none drifted more, in `drift.json`."]
    return "\n".join(lines)


def _or_dash(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def drift_lines(summary: str, rows: Sequence[dict[str, Any]], sampled: str, limit: int = 20) -> list[str]:
    """What ``trainflow models drift`` prints: where the rows came from, the line, and the
    table of the first ``limit`` features (the drifted and highest PSI first)."""
    from trainflow.pipelines.registry.versions import columns

    header = ["feature", "kind", "psi", "ks", "p-value", "drifted", "note"]
    table = [
        [r["feature"], r["kind"], f"{r['psi']:.4f}", _or_dash(r["ks"]), _or_dash(r["p_value"]),
         "yes" if r["drifted"] else "no", r["note"]]
        for r in list(rows)[:limit]
    ]  # fmt: skip
    more = [f"... {len(rows) - limit} more features, none drifted more"] if len(rows) > limit else []
    return [sampled, summary, "", *columns(header, table), *more]


# --- the sweep -----------------------------------------------------------------------


def short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trial_params(params: dict[str, Any]) -> str:
    """``train.lr=0.0123, model.dropout=0.1``: a trial's sampled settings."""
    return ", ".join(f"{k}={short(v)}" for k, v in params.items())


def _best(t: dict[str, Any]) -> str:
    return "-" if t["best"] is None else f"{t['best']:.4f}"


def trial_rows(metric: str, trials: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every trial (``TrialSummary.to_dict()``) as a Prefect table artifact's rows."""
    return [
        {
            "trial": t["trial_id"],
            "status": t["status"],
            "epochs": f"{t['epochs']}/{t['max_epochs']}",
            **{path: short(value) for path, value in t["params"].items()},
            metric: None if t["best"] is None else round(t["best"], 4),
            "best epoch": t["best_epoch"],
            "error": t["error"],
        }
        for t in trials
    ]


def sweep_lines(r: SweepResult, metric: str, also_written: Path | None = None) -> list[str]:
    """What ``trainflow sweep`` prints when the sweep is done: the trial table, then the summary."""
    from trainflow.pipelines.registry.versions import columns

    rows = [
        (t["trial_id"], t["status"], f"{t['epochs']}/{t['max_epochs']}", _best(t), trial_params(t["params"]))
        for t in r.trials
    ]
    lines = columns(("trial", "status", "epochs", metric, "params"), rows)
    lines += [_line("failed", f"{t['trial_id']}: {t['error']}") for t in r.trials if t["status"] == "failed"]
    also = f" (and {also_written})" if also_written else ""
    return [
        *lines,
        "",
        _line("best", f"trial {r.best_trial}; its config: {r.best_config_path}{also}"),
        *registered_lines(r.registered, r.test_metrics),
        _line("concurrency", f"{r.max_concurrent} trials at a time"),
        steps_line(r.timings),
    ]


def sweep_markdown(r: SweepResult, metric: str, best_config_yaml: str) -> str:
    reg = r.registered
    rows = "\n".join(
        f"| {t['trial_id']} | {t['status']} | {t['epochs']}/{t['max_epochs']} | {_best(t)} | "
        f"{trial_params(t['params'])} | {t['error']} |"
        for t in r.trials
    )
    return (
        f"# {r.name} sweep {r.sweep}\n\n"
        f"{len(r.trials)} trials, {r.max_concurrent} at a time. Best: trial {r.best_trial}, registered as "
        f"{reg.name} version {reg.version} "
        f"({'promoted to **champion**' if reg.champion else 'champion unchanged'}: "
        f"{reg.decision['reason']}); "
        f"test {lead_metric(r.test_metrics)}.\n\n"
        f"| trial | status | epochs | best {metric} | params | error |\n|---|---|---|---|---|---|\n{rows}\n\n"
        f"## The best config (`{r.best_config_path}`)\n\n```yaml\n{best_config_yaml}```\n"
    )


# --- batch prediction ----------------------------------------------------------------


def predictions_line(name: str, version: str, rows: int, output: str, seconds: float) -> str:
    return f"{rows} predictions of {name} v{version} in {output} ({seconds:.1f}s)"


def predictions_markdown(
    name: str,
    version: str,
    rows: int,
    input: str,
    output: str,
    seconds: float,
    concurrency: int,
    batch_size: int,
) -> str:
    return (
        f"# {name} v{version}: {rows} predictions\n\n"
        f"From `{input}` into `{output}` in {seconds:.1f}s "
        f"({concurrency} actor{'s' if concurrency > 1 else ''}, batch size {batch_size})."
    )


# --- a reproduced version ------------------------------------------------------------


def difference(value: float) -> str:
    """A metric's difference: ``0`` when equal, else signed with six significant digits."""
    return "0" if value == 0 else f"{value:+.6g}"


def reproduce_rows(r: Reproduced) -> list[list[str]]:
    """Each test metric of both versions and its difference, as text."""
    reg = r.result.registered
    new = r.result.test_metrics
    header = ["metric", f"v{r.of}", f"v{reg.version}", "difference"]
    both = [k for k in r.original_metrics if k in r.differences]
    rows = [[k, f"{r.original_metrics[k]:.6f}", f"{new[k]:.6f}", difference(r.differences[k])] for k in both]
    return [header, *rows]


def reproduce_lines(r: Reproduced) -> list[str]:
    """What ``trainflow models reproduce`` prints: the new version, as ``trainflow run``
    prints it, then each test metric beside the original's."""
    from trainflow.pipelines.registry.versions import columns

    reg = r.result.registered
    header, *rows = reproduce_rows(r)
    return [
        _line("reproduces", f"{reg.name} version {r.of} (tagged reproduces={r.of})"),
        *(_line("forced", change) for change in r.changed),
        *summary_lines(r.result),
        "",
        *columns(header, rows),
    ]


def reproduce_line(r: Reproduced) -> str:
    """The comparison in one line, for the flow's log."""
    reg = r.result.registered
    diffs = ", ".join(f"{k} {difference(v)}" for k, v in r.differences.items())
    return f"{reg.name} v{reg.version} reproduces v{r.of}; test metric differences: {diffs or 'none'}"


def reproduce_markdown(r: Reproduced) -> str:
    """The reproduction's Prefect artifact: the table of both versions' test metrics."""
    reg = r.result.registered
    header, *rows = reproduce_rows(r)
    table = [f"| {' | '.join(header)} |", "|---|---|---|---|", *(f"| {' | '.join(row)} |" for row in rows)]
    forced = "".join(f"\n\nReproduced with --force although {change}." for change in r.changed)
    return f"# {reg.name} v{reg.version} reproduces v{r.of}\n\n" + "\n".join(table) + forced
