"""The train split's profile (trainflow/pipelines/data/profile.py), what drift compares
against: merged across batches in any order, sampled apart, saved and loaded."""

import json

import numpy as np
import pandas as pd
import pytest

from trainflow.pipelines.data import profile as profiles
from trainflow.pipelines.data.profile import PROFILE_ROWS, Profile, frame_profile


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
    saved = frame_profile(table(50), ["x", "count"], ["color", "label"])
    profiles.save(str(tmp_path), saved)
    assert profiles.load(str(tmp_path)) == json.loads(json.dumps(saved))
    assert profiles.load(str(tmp_path / "old-checkpoint")) is None
    # attach copies an entry's profile into a checkpoint folder.
    (tmp_path / "ckpt").mkdir()
    profiles.attach(str(tmp_path), str(tmp_path / "ckpt"))
    assert profiles.load(str(tmp_path / "ckpt")) == profiles.load(str(tmp_path))
