"""Results rendered for people: Prefect artifact keys and markdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainflow.pipelines import registry, reports


def artifact_key(name: str) -> str:
    # Prefect artifact keys hold lowercase letters, digits and dashes only.
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower())


def gate_markdown(reg: registry.Registration) -> str:
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


def evaluation_markdown(name: str, metrics: dict[str, Any], plots: list[Path] = ()) -> str:
    classes = list(metrics["per_class"])
    scalars = [(k, v) for k, v in metrics.items() if isinstance(v, float)]
    lines = [
        f"# {name}: test metrics",
        "",
        f"{metrics['num_examples']} examples",
        "",
        "| metric | value |",
        "|---|---|",
        *[f"| {k} | {v:.4f} |" for k, v in scalars],
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
    for plot in plots:
        # Embedded, so the artifact shows the plot wherever the Prefect UI runs; the
        # file is also logged with the model version's MLflow run under reports/.
        lines += ["", f"![{plot.stem}]({reports.data_uri(plot)})", "", f"`{plot}`"]
    return "\n".join(lines)
