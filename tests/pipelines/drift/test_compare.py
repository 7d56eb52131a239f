"""Drift's measures on NumPy data (trainflow/pipelines/drift/compare.py): PSI, SciPy's KS
test, the report and its plot, without Ray or Prefect."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp

from tests.pipelines.test_profile import table
from trainflow.pipelines.data.profile import frame_profile
from trainflow.pipelines.drift.compare import compare, drift_png, numeric_bins, psi


def profile_of(frame: pd.DataFrame) -> dict:
    p = frame_profile(frame, ["x", "count"], ["color", "label"])
    return p | {"label": "label"}


def test_psi_is_zero_for_one_distribution_and_grows_with_the_shift():
    assert psi([50, 30, 20], [5, 3, 2]) == pytest.approx(0.0, abs=1e-12)
    small, large = psi([50, 30, 20], [45, 32, 23]), psi([50, 30, 20], [20, 30, 50])
    assert 0 < small < 0.1 < 0.2 < large
    # The textbook sum over bins of (actual - expected) * ln(actual / expected).
    e, a = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    assert large == pytest.approx(np.sum((a - e) * np.log(a / e)))
    # A bin empty on one side gives a large, finite index.
    assert np.isfinite(psi([10, 0], [5, 5])) and psi([10, 0], [5, 5]) > 1


def test_numeric_bins_cut_at_deciles_or_per_value_for_few_values():
    rng = np.random.default_rng(1)
    reference = rng.normal(size=5000)
    bins, ref, cur = numeric_bins(reference, reference + 10)
    assert len(bins) == 10 and ref.sum() == 5000 and np.all(np.abs(ref - 500) <= 1)
    assert cur[-1] == 5000  # everything shifted lands above the last decile
    # A constant column: its value and "other", so that any other value shows.
    bins, ref, cur = numeric_bins(np.zeros(100), np.array([0.0, 0.0, 1.0, 2.0]))
    assert bins == ["0", "other"] and ref.tolist() == [100, 0] and cur.tolist() == [2, 2]


def test_compare_finds_the_shifted_column_with_psi_and_scipys_ks_test():
    reference, shifted = table(3000), table(3000, seed=1, shift=0.6)
    report = compare(profile_of(reference), profile_of(shifted), psi_threshold=0.2, ks_pvalue=0.001)
    x = next(f for f in report.features if f.feature == "x")
    assert x.drifted and x.kind == "numeric" and x.psi > 0.2
    # The KS test is SciPy's, on the two profiles' samples.
    ref_sample, new_sample = profile_of(reference)["numeric"]["x"], profile_of(shifted)["numeric"]["x"]
    assert x.ks == pytest.approx(ks_2samp(ref_sample, new_sample).statistic)
    assert x.p_value < 1e-10
    assert [f.feature for f in report.drifted] == ["x"]
    assert report.summary().startswith("1 of 4 features drifted from its reference: x (psi ")
    label = next(f for f in report.features if f.feature == "label")
    assert label.kind == "label" and not label.drifted


def test_the_same_data_drifts_nowhere_and_a_resample_stays_under_the_thresholds():
    reference = profile_of(table(3000))
    same = compare(reference, profile_of(table(3000)), psi_threshold=0.2, ks_pvalue=0.001)
    assert same.drifted == [] and all(f.psi == pytest.approx(0.0, abs=1e-9) for f in same.features)
    resample = compare(reference, profile_of(table(3000, seed=7)), psi_threshold=0.2, ks_pvalue=0.001)
    assert resample.drifted == [], resample.summary()


def test_a_new_category_and_a_moved_label_are_categorical_drift():
    reference = table(2000)
    new = table(2000, seed=3)
    new.loc[:600, "color"] = "purple"
    new.loc[:1500, "label"] = 1
    report = compare(profile_of(reference), profile_of(new), psi_threshold=0.2, ks_pvalue=None)
    by_name = {f.feature: f for f in report.features}
    assert by_name["color"].drifted and by_name["color"].note == "1 new: purple"
    assert by_name["label"].drifted and by_name["label"].kind == "label"
    assert not by_name["x"].drifted  # ks_pvalue null: the PSI alone decides
    assert report.rows()[0]["drifted"] and not report.rows()[-1]["drifted"]


def test_the_drift_plot_is_a_png(tmp_path):
    report = compare(
        profile_of(table(500)), profile_of(table(500, shift=1.0)), psi_threshold=0.2, ks_pvalue=0.01
    )
    report.reference = "digits version 1"
    path = drift_png(report, tmp_path / "drift.png")
    assert path.read_bytes().startswith(b"\x89PNG")
