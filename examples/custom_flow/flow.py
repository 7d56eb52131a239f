"""A flow of your own around trainflow's steps.

Between preparing the data and training it runs a check of its own (every class holds
enough of the train split), and after evaluation a report of its own (the classes the
model confuses most, as a Prefect artifact). trainflow's steps are Prefect tasks: each
opens what it needs (a Ray session, the working folders) when the flow has not.

    python examples/custom_flow/flow.py                              # the digits job
    python examples/custom_flow/flow.py train.epochs=2 model.kind=mlp  # with overrides
"""

import sys

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from trainflow import load_config
from trainflow.tasks import evaluate, ingest, preprocess, register, train
from trainflow.tasks.results import Evaluated, Prepared, Registered


@task
def check_class_balance(prepared: Prepared, least: float = 0.05) -> dict[str, int]:
    """Each class's rows in the train split; fails the run when one holds under ``least``
    of them (a class the model would hardly see)."""
    classes = prepared.preprocessor["classes"]
    labels = pd.read_parquet(prepared.split_path("train"), columns=["label"])["label"]
    counts = {str(classes[i]): int(n) for i, n in labels.value_counts().sort_index().items()}
    rare = [name for name, n in counts.items() if n < least * len(labels)]
    if rare:
        raise ValueError(f"classes {rare} hold under {least:.0%} of the {len(labels)} train rows")
    get_run_logger().info("train rows per class: %s", counts)
    return counts


@task
def confusion_report(evaluated: Evaluated, top: int = 3) -> list[tuple[str, str, int]]:
    """The ``top`` pairs of classes the model confuses most on the test split, as a
    markdown artifact: (true class, predicted class, test rows)."""
    names = list(evaluated.metrics["per_class"])
    matrix = np.array(evaluated.metrics["confusion_matrix"])
    np.fill_diagonal(matrix, 0)
    worst = np.dstack(np.unravel_index(np.argsort(matrix, axis=None)[::-1][:top], matrix.shape))[0]
    pairs = [(names[t], names[p], int(matrix[t, p])) for t, p in worst if matrix[t, p]]
    rows = "\n".join(f"| {t} | {p} | {n} |" for t, p, n in pairs) or "| - | - | 0 |"
    create_markdown_artifact(
        key="most-confused", markdown=f"| true | predicted | test rows |\n|---|---|---|\n{rows}\n"
    )
    return pairs


@flow
def my_training(config: str = "configs/digits.yaml", overrides: list[str] | None = None) -> Registered:
    cfg = load_config(config, overrides or [])
    source = ingest(cfg)
    prepared = preprocess(cfg, source)
    check_class_balance(prepared)
    trained = train(cfg, prepared)
    evaluated = evaluate(cfg, prepared, trained)
    confusion_report(evaluated)
    return register(cfg, source, prepared, trained, evaluated)


if __name__ == "__main__":
    registered = my_training(overrides=sys.argv[1:])
    print(f"registered {registered.name} version {registered.version}")
