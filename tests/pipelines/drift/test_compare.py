"""Drift's measures on NumPy data, and the profile they compare, without Ray or Prefect."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp

from trainflow.config import ConfigError, load_config
from trainflow.pipelines.data import profile as profiles
from trainflow.pipelines.data.profile import PROFILE_ROWS, Profile, frame_profile
from trainflow.pipelines.drift.compare import compare, drift_png, numeric_bins, psi


def table(rows: int, seed: int = 0, shift: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "x": rng.normal(shift, 1.0, rows),
            "count": rng.integers(0, 4, rows),
            "color": rng.choice(["red", "green", "blue"], rows, p=[0.5, 0.3, 0.2]),
            "label": rng.integers(0, 2, rows),
        }
    )


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


def test_a_profile_merged_from_batches_in_any_order_is_the_one_pass_profile():
    frame = table(5000)
    whole = Profile()
    whole.add(frame, ["x", "count"], ["color"])
    parts = [frame.iloc[i : i + 700] for i in range(0, 5000, 700)]
    merged_profiles = []
    for order in (parts, parts[::-1]):
        batches = []
        for part in order:
            p = Profile()
            p.add(part, ["x", "count"], ["color"])
            batches.append(p)
        merged = Profile()
        for p in batches:
            merged.merge(p)
        merged_profiles.append(merged.to_dict())
    assert merged_profiles[0] == merged_profiles[1]
    assert merged_profiles[0]["rows"] == 5000 and merged_profiles[0]["sample_rows"] == PROFILE_ROWS
    # Counts are exact; the sample is a bounded one of the rows' values.
    assert dict(zip(*merged_profiles[0]["categorical"]["color"].values(), strict=True)) == (
        frame["color"].value_counts().to_dict()
    )
    assert set(merged_profiles[0]["numeric"]["count"]) <= {0, 1, 2, 3}
    # Batches sample rows uniformly: the sample's mean is the column's, within noise.
    assert np.mean(merged_profiles[0]["numeric"]["x"]) == pytest.approx(frame["x"].mean(), abs=0.15)


def test_equal_rows_are_sampled_apart():
    # A column of few values: keys from the rows' content alone would keep or drop every
    # copy of a value together.
    frame = pd.DataFrame({"v": np.repeat([1.0, 2.0, 3.0, 4.0], 5000)})
    p = Profile()
    p.add(frame, ["v"], [])
    counts = pd.Series(p.to_dict()["numeric"]["v"]).value_counts()
    assert sorted(counts.index) == [1, 2, 3, 4] and counts.min() > 150


def test_a_batch_gets_the_same_sample_keys_in_either_memory_order_and_others_get_others():
    values = np.random.default_rng(0).normal(size=(1000, 3))
    keys = profiles.sample_keys(np.asfortranarray(values))
    assert np.array_equal(keys, profiles.sample_keys(np.ascontiguousarray(values)))
    assert not np.array_equal(keys, profiles.sample_keys(values + 1))


def test_profiles_are_saved_and_loaded_and_a_folder_without_one_says_none(tmp_path):
    saved = profile_of(table(50))
    profiles.save(str(tmp_path), saved)
    assert profiles.load(str(tmp_path)) == json.loads(json.dumps(saved))
    assert profiles.load(str(tmp_path / "old-checkpoint")) is None
    # attach copies an entry's profile into a checkpoint folder.
    (tmp_path / "ckpt").mkdir()
    profiles.attach(str(tmp_path), str(tmp_path / "ckpt"))
    assert profiles.load(str(tmp_path / "ckpt")) == profiles.load(str(tmp_path))


def test_the_drift_plot_is_a_png(tmp_path):
    report = compare(
        profile_of(table(500)), profile_of(table(500, shift=1.0)), psi_threshold=0.2, ks_pvalue=0.01
    )
    report.reference = "digits version 1"
    path = drift_png(report, tmp_path / "drift.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_the_drift_section_is_checked_and_hashed_only_when_set():
    plain = load_config({})
    assert plain.drift is None
    warned = load_config({"drift": {}})
    assert (warned.drift.action, warned.drift.psi, warned.drift.ks_pvalue) == ("warn", 0.2, 0.001)
    assert warned.config_hash() != plain.config_hash()
    assert load_config({}, ["drift.action=block"]).drift.action == "block"
    with pytest.raises(ConfigError, match="drift.action"):
        load_config({"drift": {"action": "stop"}})
    with pytest.raises(ConfigError, match="drift.ks_pvalue"):
        load_config({"drift": {"ks_pvalue": 1.5}})


def test_registering_with_another_runs_drift_result_is_refused():
    from trainflow.tasks.results import Drifted, Prepared
    from trainflow.tasks.steps import StepInputError

    prepared = Prepared(
        path="/cache/a",
        counts={},
        preprocessor={},
        num_features=1,
        num_outputs=2,
        fingerprint="aaa",
        reused=False,
    )
    Drifted(prepared="aaa").check_measured(prepared, "register")
    with pytest.raises(StepInputError, match=r"register: drifted measured other prepared splits \(bbb\)"):
        Drifted(prepared="bbb").check_measured(prepared, "register")
