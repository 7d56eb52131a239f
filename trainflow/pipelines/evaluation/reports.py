"""Plots a user looks at, as PNG files: the learning curve; the confusion matrix of a
classifier; a regression's predicted-against-true scatter and residual histogram.

Drawn with matplotlib's Agg canvas on a Figure of their own, so nothing touches pyplot's
global state or needs a display (Prefect workers, CI, Ray nodes have none).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np

from trainflow.files import replacing_file

LEARNING_CURVE = "learning_curve.png"
CONFUSION_MATRIX = "confusion_matrix.png"
PREDICTED_VS_TRUE = "predicted_vs_true.png"
RESIDUALS = "residuals.png"


def save_png(fig, path: str | Path) -> Path:
    """A matplotlib Figure written to ``path`` as a PNG, whole (under a temporary name, renamed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with replacing_file(path) as tmp:
        FigureCanvasAgg(fig).print_png(str(tmp))
    return Path(path)


def learning_curve_png(history: list[dict[str, Any]], path: str | Path, metric: str = "val_accuracy") -> Path:
    """Train and validation loss (left axis) and a validation metric (right axis) per epoch."""
    from matplotlib.figure import Figure

    if not history:
        raise ValueError("learning curve: the training history is empty")
    epochs = [row["epoch"] for row in history]
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.add_subplot()
    for key, style in (("train_loss", "-o"), ("val_loss", "-s")):
        if key in history[0]:
            ax.plot(epochs, [row[key] for row in history], style, label=key.replace("_", " "), markersize=3)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    lines, labels = ax.get_legend_handles_labels()
    if metric in history[0]:
        right = ax.twinx()
        right.plot(epochs, [row[metric] for row in history], "-^", color="tab:green", markersize=3)
        right.set_ylabel(metric.replace("_", " "))
        lines += right.get_lines()
        labels += [metric.replace("_", " ")]
    ax.legend(lines, labels, loc="center right")
    ax.set_title("learning curve")
    fig.tight_layout()
    return save_png(fig, path)


def confusion_matrix_png(matrix: list[list[int]], classes: list[Any], path: str | Path) -> Path:
    """Counts per (true, predicted) class, darker for more, with the numbers written in."""
    from matplotlib.figure import Figure

    cm = np.asarray(matrix)
    n = len(classes)
    size = min(2.0 + 0.5 * n, 12.0)
    fig = Figure(figsize=(size, size), dpi=100)
    ax = fig.add_subplot()
    ax.imshow(cm, cmap="Blues")
    ax.set_xticks(range(n), [str(c) for c in classes])
    ax.set_yticks(range(n), [str(c) for c in classes])
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if n <= 30:
        threshold = cm.max() / 2 if cm.size else 0
        for i in range(n):
            for j in range(n):
                color = "white" if cm[i, j] > threshold else "black"
                ax.text(j, i, str(cm[i, j]), ha="center", va="center", color=color, fontsize=8)
    ax.set_title("confusion matrix (test)")
    fig.tight_layout()
    return save_png(fig, path)


def predicted_vs_true_png(y_true: list[float], y_pred: list[float], path: str | Path) -> Path:
    """Each test row's prediction against its true value, with the diagonal a perfect
    model would lie on."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0, 5.0), dpi=100)
    ax = fig.add_subplot()
    ax.scatter(y_true, y_pred, s=8, alpha=0.5)
    if len(y_true):
        lo = min(min(y_true), min(y_pred))
        hi = max(max(y_true), max(y_pred))
        ax.plot([lo, hi], [lo, hi], "--", color="tab:gray", linewidth=1)
    ax.set_xlabel("true")
    ax.set_ylabel("predicted")
    ax.grid(alpha=0.3)
    ax.set_title("predicted vs true (test)")
    fig.tight_layout()
    return save_png(fig, path)


def residuals_png(y_true: list[float], y_pred: list[float], path: str | Path) -> Path:
    """The histogram of the test rows' residuals (predicted minus true)."""
    from matplotlib.figure import Figure

    residuals = np.asarray(y_pred, dtype=float) - np.asarray(y_true, dtype=float)
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.add_subplot()
    ax.hist(residuals, bins=min(50, max(5, len(residuals) // 10)), color="tab:blue", alpha=0.8)
    ax.axvline(0.0, color="tab:gray", linestyle="--", linewidth=1)
    ax.set_xlabel("predicted - true")
    ax.set_ylabel("rows")
    ax.set_title("residuals (test)")
    fig.tight_layout()
    return save_png(fig, path)


def data_uri(path: str | Path) -> str:
    """A PNG as a data: URI, to embed a small plot in a markdown artifact."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()
