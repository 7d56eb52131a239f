"""How far new data moved from a model's train split, feature by feature.

Two profiles (:mod:`trainflow.pipelines.data.profile`) are compared: the reference (a
champion's, saved with it) and the current one (this run's train split, or any rows as
:func:`~trainflow.pipelines.data.profile.frame_profile` makes them). Per numeric column:
the population stability index over ten bins cut at the reference sample's deciles (a
column of few distinct values: one bin per value, and one for anything else), and
SciPy's two-sample Kolmogorov-Smirnov test of the two samples. Per categorical column
and a classifier's label: the PSI over the categories, a category the reference never
saw among them. The report is a table (:meth:`DriftReport.rows`) and a plot
(:func:`drift_png`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainflow.pipelines.data import profile as profiles
from trainflow.pipelines.data.schema import DataError
from trainflow.pipelines.evaluation.reports import save_png

if TYPE_CHECKING:
    from trainflow.config import DriftConfig
    from trainflow.workspace import Workspace

PSI_BINS = 10
# A bin's share is floored at this: a bin empty on one side would make the PSI infinite.
MIN_SHARE = 1e-4
OTHER = "other"  # the bin of values the reference never held
EXACT_KS = 10_000  # samples' sizes multiplied, up to which the KS p-value is exact
DRIFT_PNG = "drift.png"
# The features the drift plot shows, the highest PSI first.
PLOT_FEATURES = 20


class DataDrift(DataError):
    """New data drifted past drift's thresholds under ``drift.action: block``; the
    message names each drifted feature with its scores."""


def shares(counts: np.ndarray | list[float]) -> np.ndarray:
    """Counts as shares that sum to 1, each at least about MIN_SHARE."""
    c = np.asarray(counts, dtype=np.float64)
    s = c / c.sum() if c.sum() else np.full(len(c), 1.0 / len(c))
    s = np.maximum(s, MIN_SHARE)
    return s / s.sum()


def psi(expected: np.ndarray | list[float], actual: np.ndarray | list[float]) -> float:
    """The population stability index of two distributions over the same bins (counts or
    shares): the sum over bins of (actual - expected) * ln(actual / expected)."""
    e = shares(expected)
    a = shares(actual)
    return float(np.sum((a - e) * np.log(a / e)))


def numeric_bins(reference: np.ndarray, current: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The bins of a numeric column and each sample's count in them: one per distinct
    reference value (and one for any other) when it holds at most PSI_BINS of them, else
    PSI_BINS cut at the reference's deciles."""
    distinct = np.unique(reference)
    if len(distinct) <= PSI_BINS:
        ref = np.array([*(np.sum(reference == v) for v in distinct), 0])
        seen = np.array([np.sum(current == v) for v in distinct])
        cur = np.array([*seen, len(current) - seen.sum()])
        return [*(f"{v:g}" for v in distinct), OTHER], ref, cur
    edges = np.unique(np.quantile(reference, np.linspace(0, 1, PSI_BINS + 1)[1:-1]))
    ref = np.bincount(np.searchsorted(edges, reference, side="right"), minlength=len(edges) + 1)
    cur = np.bincount(np.searchsorted(edges, current, side="right"), minlength=len(edges) + 1)
    bounds = ["-inf", *(f"{e:.4g}" for e in edges), "inf"]
    return [f"[{lo}, {hi})" for lo, hi in zip(bounds, bounds[1:], strict=False)], ref, cur


def category_bins(
    reference: dict[str, list], current: dict[str, list]
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The categories of both sides (the reference's first) and each side's count of them."""
    ref = dict(zip(reference["values"], reference["counts"], strict=True))
    cur = dict(zip(current["values"], current["counts"], strict=True))
    values = [*ref, *(v for v in cur if v not in ref)]
    counts = (np.array([side.get(v, 0) for v in values]) for side in (ref, cur))
    return [str(v) for v in values], *counts


@dataclass
class FeatureDrift:
    """One feature's drift: its PSI, for numbers the KS statistic and p-value, whether it
    crossed a threshold, and each side's share of its bins (for the plot)."""

    feature: str
    kind: str  # numeric, categorical, or label
    psi: float
    ks: float | None = None
    p_value: float | None = None
    drifted: bool = False
    note: str = ""
    bins: list[str] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)  # the reference's share of each bin
    current: list[float] = field(default_factory=list)

    def scores(self) -> str:
        """``psi 0.412, ks 0.318 (p 2.1e-09)``."""
        ks = "" if self.ks is None else f", ks {self.ks:.3f} (p {self.p_value:.2g})"
        return f"psi {self.psi:.3f}{ks}"


@dataclass
class DriftReport:
    """Every feature's drift from the reference, and what decided it."""

    reference_rows: int
    current_rows: int
    psi_threshold: float
    ks_pvalue: float | None
    features: list[FeatureDrift]
    reference: str = ""  # what the reference is: "digits version 3"

    @property
    def drifted(self) -> list[FeatureDrift]:
        return [f for f in self.features if f.drifted]

    def summary(self, limit: int = 5) -> str:
        """``2 of 65 features drifted from digits version 3: pixel_3 (psi 0.412, ...), ...``."""
        drifted = sorted(self.drifted, key=lambda f: -f.psi)
        source = self.reference or "its reference"
        head = f"{len(drifted)} of {len(self.features)} features drifted from {source}"
        if not drifted:
            return head
        named = ", ".join(f"{f.feature} ({f.scores()})" for f in drifted[:limit])
        more = f" and {len(drifted) - limit} more" if len(drifted) > limit else ""
        return f"{head}: {named}{more}"

    def rows(self) -> list[dict[str, Any]]:
        """The table: a row per feature, the most drifted first."""
        return [
            {
                "feature": f.feature,
                "kind": f.kind,
                "psi": round(f.psi, 4),
                "ks": None if f.ks is None else round(f.ks, 4),
                "p_value": None if f.p_value is None else float(f"{f.p_value:.3g}"),
                "drifted": f.drifted,
                "note": f.note,
            }
            for f in sorted(self.features, key=lambda f: (not f.drifted, -f.psi))
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _numeric(
    name: str, kind: str, ref: list[float], cur: list[float], ks_pvalue: float | None
) -> FeatureDrift:
    from scipy.stats import ks_2samp

    reference = np.asarray(ref, dtype=np.float64)
    current = np.asarray(cur, dtype=np.float64)
    if not len(current) or not len(reference):
        return FeatureDrift(name, kind, 0.0, note="no values to compare")
    bins, r, c = numeric_bins(reference, current)
    # SciPy's exact p-value is for small samples; above, its own method falls back to the
    # asymptotic one with a warning.
    method = "exact" if len(reference) * len(current) <= EXACT_KS else "asymp"
    test = ks_2samp(reference, current, method=method)
    drift = FeatureDrift(name, kind, psi(r, c), float(test.statistic), float(test.pvalue))
    drift.drifted = ks_pvalue is not None and drift.p_value < ks_pvalue
    drift.bins = bins
    drift.reference = shares(r).tolist()
    drift.current = shares(c).tolist()
    return drift


def _categorical(name: str, kind: str, ref: dict[str, list], cur: dict[str, list]) -> FeatureDrift:
    bins, r, c = category_bins(ref, cur)
    drift = FeatureDrift(name, kind, psi(r, c) if c.sum() else 0.0)
    new = [b for b, n_ref, n_cur in zip(bins, r, c, strict=True) if n_ref == 0 and n_cur]
    drift.note = f"{len(new)} new: {', '.join(new[:3])}{'...' if len(new) > 3 else ''}" if new else ""
    drift.bins = bins
    drift.reference = shares(r).tolist()
    drift.current = shares(c).tolist()
    return drift


def compare(
    reference: dict[str, Any], current: dict[str, Any], *, psi_threshold: float, ks_pvalue: float | None
) -> DriftReport:
    """Each feature of the reference profile that the current one holds, scored; a
    feature drifted when its PSI reaches ``psi_threshold`` or (numbers) its KS p-value
    falls below ``ks_pvalue``."""
    label = reference.get("label")
    features = []
    for name, ref in reference["numeric"].items():
        if name in current["numeric"]:
            kind = "label" if name == label else "numeric"
            features.append(_numeric(name, kind, ref, current["numeric"][name], ks_pvalue))
    for name, ref in reference["categorical"].items():
        if name in current["categorical"]:
            features.append(
                _categorical(
                    name, "label" if name == label else "categorical", ref, current["categorical"][name]
                )
            )
    for f in features:
        f.drifted = f.drifted or (math.isfinite(f.psi) and f.psi >= psi_threshold)
    return DriftReport(reference["rows"], current["rows"], psi_threshold, ks_pvalue, features)


def compare_with(reference: dict[str, Any], current: dict[str, Any], config: DriftConfig) -> DriftReport:
    """:func:`compare` with a config's drift thresholds."""
    return compare(reference, current, psi_threshold=config.psi, ks_pvalue=config.ks_pvalue)


def drift_png(report: DriftReport, path: str | Path) -> Path:
    """Left, each feature's PSI (the highest first, drifted ones in red) against the
    threshold; right, the reference's and the new data's share of each bin of the
    feature with the highest PSI."""
    from matplotlib.figure import Figure

    shown = sorted(report.features, key=lambda f: -f.psi)[:PLOT_FEATURES]
    fig = Figure(figsize=(11.0, 0.6 + 0.25 * max(len(shown), 8)), dpi=100)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})
    names = [f.feature for f in reversed(shown)]
    colors = ["tab:red" if f.drifted else "tab:blue" for f in reversed(shown)]
    left.barh(names, [f.psi for f in reversed(shown)], color=colors)
    left.axvline(report.psi_threshold, color="tab:gray", linestyle="--", linewidth=1)
    left.set_xlabel("population stability index")
    left.set_title(f"drift from {report.reference or 'the reference'}")
    if shown and shown[0].bins:
        top = shown[0]
        x = np.arange(len(shown[0].bins))
        right.bar(x - 0.2, top.reference, width=0.4, label="reference", color="tab:gray")
        right.bar(
            x + 0.2, top.current, width=0.4, label="new", color="tab:red" if top.drifted else "tab:blue"
        )
        right.set_xticks(x, top.bins, rotation=45, ha="right", fontsize=7)
        right.set_ylabel("share of rows")
        right.set_title(f"{top.feature} ({top.scores()})", fontsize=9)
        right.legend()
    fig.tight_layout()
    return save_png(fig, path)


@dataclass
class Reference:
    """A registered version and the profile saved with it (None: registered before
    profiles were saved)."""

    name: str
    version: str
    profile: dict[str, Any] | None
    storage: str | None = None  # its config's storage, where its served samples go

    def __str__(self) -> str:
        return f"{self.name} version {self.version}"


def registered_profile(ws: Workspace, name: str, alias: str = "champion") -> Reference | None:
    """The profile of the version ``alias`` of model ``name`` points at; None when the
    registry holds no such model or alias."""
    from trainflow.pipelines.models.checkpoint import CONFIG
    from trainflow.pipelines.registry.gate import alias_version
    from trainflow.pipelines.registry.store import client
    from trainflow.pipelines.registry.versions import local_checkpoint

    mv = alias_version(client(ws), name, alias)
    if mv is None:
        return None
    folder = local_checkpoint(ws, mv)
    config = folder / CONFIG
    storage = json.loads(config.read_text()).get("storage") if config.is_file() else None
    return Reference(name, str(mv.version), profiles.load(str(folder)), storage)
