"""preprocess.transform: the user's batch transform runs on every batch before the checks,
the split and the fit; its array columns are prepared as they are (integers) or scaled
number by number (floats); a bad one fails in one line before any worker starts; a
changed one prepares again; a model asks for several inputs by name or gets them joined.
Preparation of a small file runs in the driver: no Ray here."""

import importlib
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from trainflow import run_checks
from trainflow.config import (
    ConfigError,
    DataConfig,
    ModelConfig,
    PipelineConfig,
    PreprocessConfig,
    SplitConfig,
)
from trainflow.pipelines.data import transform as transforms
from trainflow.pipelines.data.entry import read_split
from trainflow.pipelines.data.prepare import prepare
from trainflow.pipelines.data.preprocess import FEATURES, LABEL, Preprocessor
from trainflow.pipelines.data.schema import inspect_source
from trainflow.pipelines.models.build import build_model, joined, model_spec
from trainflow.pipelines.serving.requests import RequestError, parse_inputs

WORDS = {"up": "rise climb grow gain lift", "down": "fall drop sink lose dive"}

# A transform of the shape users write: text to int64 token ids and a float window, every
# other column (the label, when there is one) passed through.
TRANSFORM = """
import numpy as np

VOCAB = {w: i + 1 for i, w in enumerate("rise climb grow gain lift fall drop sink lose dive".split())}


def tokens(batch):
    out = batch.drop(columns=["text"])
    out["ids"] = [np.array(([VOCAB.get(w, 0) for w in t.split()] + [0] * 4)[:4]) for t in batch["text"]]
    out["window"] = [np.array([v, 2 * v, 100 + v], dtype=np.float64) for v in batch["x"]]
    return out.drop(columns=["x"])
"""


def texts(n: int = 120, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    labels = rng.choice(["up", "down"], n)
    return pd.DataFrame(
        {
            "text": [" ".join(rng.choice(WORDS[k].split(), 3)) for k in labels],
            "x": rng.normal(5.0, 2.0, n),
            "label": labels,
        }
    )


@pytest.fixture
def code(tmp_path, monkeypatch):
    """A folder on sys.path for the test's own modules, each written by ``write(name, source)``."""
    folder = tmp_path / "code"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    written = []

    def write(name: str, source: str) -> str:
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        sys.modules.pop(name, None)
        importlib.invalidate_caches()
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def _csv(tmp_path, frame: pd.DataFrame) -> str:
    path = tmp_path / "texts.csv"
    frame.to_csv(path, index=False)
    return str(path)


def _split(entry, name: str) -> dict[str, np.ndarray]:
    return read_split(entry.split_path(name))


def test_int_arrays_stay_int64_unscaled_and_float_arrays_scale_number_by_number(tmp_path, code):
    code("tr_arrays", TRANSFORM)
    frame = texts()
    info = inspect_source(DataConfig(source=_csv(tmp_path, frame)), transform="tr_arrays:tokens")
    assert info.input_columns == ["ids", "window"] and info.raw_columns == {
        "text": "string",
        "x": "double",
        "label": "string",
    }
    assert info.arrays == {
        "ids": {"shape": [4], "dtype": "int64"},
        "window": {"shape": [3], "dtype": "float32"},
    }
    entry = prepare(info, SplitConfig(), PreprocessConfig(transform="tr_arrays:tokens"), tmp_path / "cache")
    train = _split(entry, "train")
    # No numeric or categorical column: no features column, each array by its own name.
    assert list(train) == ["ids", "window", LABEL]
    ids, window = train["ids"], train["window"]
    assert ids.dtype == np.int64 and set(np.unique(ids)) <= set(range(11))
    assert window.dtype == np.float32
    np.testing.assert_allclose(window.mean(axis=0), 0.0, atol=1e-4)  # each number standardized
    np.testing.assert_allclose(window.std(axis=0), 1.0, atol=1e-3)
    pre = entry.preprocessor
    assert pre.layout == {
        "ids": {"shape": [4], "dtype": "int64"},
        "window": {"shape": [3], "dtype": "float32"},
    }
    assert pre.num_features == 7 and pre.raw_columns == ["text", "x"]
    assert pre.transform["path"] == "tr_arrays:tokens" and pre.transform["hash"] == transforms.code_hash(
        "tr_arrays:tokens"
    )
    # Prediction hands the transform the raw columns, without the label.
    inputs = pre.model_inputs(frame.drop(columns=["label"]).head(3))
    assert inputs["ids"].dtype == np.int64 and inputs["ids"].shape == (3, 4)

    unscaled = prepare(
        info, SplitConfig(), PreprocessConfig(scaler="none", transform="tr_arrays:tokens"), tmp_path / "c2"
    )
    window = _split(unscaled, "train")["window"]
    assert window[:, 2].min() > 90  # 100 + x, as the transform gave it


def test_data_without_arrays_is_prepared_and_saved_as_before(tmp_path, code):
    """A transform that leaves numbers alone: the prepared split's one column is features."""
    code(
        "tr_numbers", "def double(batch):\n    return batch.assign(x=batch['x'] * 2).drop(columns=['text'])\n"
    )
    info = inspect_source(DataConfig(source=_csv(tmp_path, texts())), transform="tr_numbers:double")
    entry = prepare(info, SplitConfig(), PreprocessConfig(transform="tr_numbers:double"), tmp_path / "cache")
    assert list(_split(entry, "train")) == [FEATURES, LABEL]
    assert entry.preprocessor.layout is None and entry.preprocessor.offset[0] == pytest.approx(10.0, abs=1.0)
    # Without a transform, the state holds no key a trainflow before transforms did not write.
    state = Preprocessor(["x"], "label", ["a", "b"], [0.0], [1.0]).to_dict()
    assert "arrays" not in state and "transform" not in state


def test_a_changed_transform_prepares_again(tmp_path, code):
    source = _csv(tmp_path, texts())
    code("tr_changes", "def fn(batch):\n    return batch.drop(columns=['text'])\n")
    cfg = PreprocessConfig(transform="tr_changes:fn")

    def prepared():
        return prepare(
            inspect_source(DataConfig(source=source), transform=cfg.transform),
            SplitConfig(),
            cfg,
            tmp_path / "cache",
        )

    first = prepared()
    assert not first.reused and prepared().reused
    code(
        "tr_changes",
        "def fn(batch):\n    return batch.drop(columns=['text']).assign(x=lambda b: b['x'] + 1)\n",
    )
    again = prepared()
    assert not again.reused and again.key != first.key


BAD = {  # what the config names, the module's code, what the one line says
    "does not import": ("tr_nothere_at_all:fn", None, "module 'tr_nothere_at_all' is not importable"),
    "raises": ("tr_raises:fn", "raise KeyError('txt')", "raised KeyError"),
    "returns a non-DataFrame": (
        "tr_list:fn",
        "return list(batch)",
        "returned a list, not a pandas DataFrame",
    ),
    "leaves a string column": ("tr_string:fn", "return batch", "leaves the columns text"),
    "varying-length arrays": (
        "tr_ragged:fn",
        "return batch.assign(text=[[1] * (i % 3 + 1) for i in range(len(batch))])",
        "holds arrays of shapes [1], [2], [3]",
    ),
    "drops the label": ("tr_label:fn", "return batch[['x']]", "lacks the label column 'label'"),
    "needs the label at prediction": (
        "tr_needs:fn",
        "return batch.assign(y=batch['label']).drop(columns=['text'])",
        "raised KeyError: 'label'",
    ),
    "drops rows": ("tr_rows:fn", "return batch.iloc[1:].drop(columns=['text'])", "returned 63 rows for 64"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_transform_fails_in_one_line_before_any_worker_starts(case, tmp_path, code, trainflow_home):
    path, source, expected = BAD[case]
    if source is not None:
        code(path.partition(":")[0], f"def fn(batch):\n    {source}\n")
    config = PipelineConfig(
        data={"source": _csv(tmp_path, texts())}, preprocess={"transform": path}, model={"kind": "mlp"}
    )
    connected = "ray" in sys.modules and __import__("ray").is_initialized()  # another test's session
    with pytest.raises(ConfigError) as raised:
        run_checks.before_run(config)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"preprocess.transform {path}"), message
    assert expected in message, message
    # The checks started no Ray: a session this process did not have before is not there now.
    assert connected or "ray" not in sys.modules or not __import__("ray").is_initialized()


def test_a_model_asks_for_its_inputs_by_name_or_gets_them_joined(code):
    code(
        "tr_two_inputs",
        """
        import torch
        from torch import nn


        class Two(nn.Module):
            def __init__(self, inputs, num_outputs):
                super().__init__()
                self.shapes = inputs
                self.embed = nn.EmbeddingBag(16, 4)
                self.head = nn.Linear(4 + inputs["window"][0], num_outputs)

            def forward(self, x):
                assert x["ids"].dtype == torch.int64 and x["window"].dtype == torch.float32
                return self.head(torch.cat([self.embed(x["ids"]), x["window"]], dim=1))


        def flat(input_shape, num_outputs):
            return nn.Linear(input_shape[0], num_outputs)
        """,
    )
    layout = {"ids": {"shape": [4], "dtype": "int64"}, "window": {"shape": [3], "dtype": "float32"}}
    spec = model_spec(ModelConfig(kind="tr_two_inputs:Two"), 7, 2, inputs=layout)
    assert spec["by_name"] and spec["inputs"] == layout
    model = build_model(spec)
    assert model.net.shapes == {"ids": [4], "window": [3]}
    batch = {"ids": torch.ones(5, 4, dtype=torch.int64), "window": torch.zeros(5, 3)}
    assert model(batch).shape == (5, 2)

    flat = build_model(model_spec(ModelConfig(kind="tr_two_inputs:flat"), 7, 2, inputs=layout))
    assert flat(batch).shape == (5, 2) and "by_name" not in model_spec(
        ModelConfig(kind="tr_two_inputs:flat"), 7, 2
    )
    # Joined end to end: floats when any input is; integers kept when all are.
    assert joined(batch, ["ids", "window"]).dtype == torch.float32
    assert joined(batch, ["ids"]).dtype == torch.int64 and joined(batch, ["ids"]).shape == (5, 4)
    mlp = build_model(model_spec(ModelConfig(kind="mlp", hidden_sizes=[8]), 7, 2, inputs=layout))
    assert mlp(batch).shape == (5, 2)


def test_a_served_request_of_a_transforms_model_holds_its_raw_columns():
    raw = {"text": "string", "n": "int64", "label": "string"}
    pre = Preprocessor(
        [], "label", ["up", "down"], scaler="none",
        arrays={"ids": {"shape": [4], "dtype": "int64"}},
        transform={"path": "m:fn", "hash": "0", "columns": raw},
    )  # fmt: skip
    inputs = parse_inputs({"rows": [{"text": "rise fall", "n": 3}, {"text": "dive", "n": 1}]}, pre, 10)
    assert inputs.rows == 2 and list(inputs.columns["text"]) == ["rise fall", "dive"]
    assert inputs.columns["n"].dtype == np.int64
    for payload, field in (
        ({"rows": [{"text": 5, "n": 1}]}, "rows[0].text"),
        ({"rows": [{"n": 1}]}, "rows[0].text"),
        ({"columns": {"text": ["a"], "n": ["b"]}}, "columns.n[0]"),
    ):
        with pytest.raises(RequestError) as raised:
            parse_inputs(payload, pre, 10)
        assert raised.value.field == field, raised.value


def test_the_ingest_step_inspects_again_when_the_transform_changes(tmp_path, code, trainflow_home):
    from trainflow.tasks.prepare import ingest_cache_key

    code("tr_ingest", "def fn(batch):\n    return batch.drop(columns=['text'])\n")
    config = PipelineConfig(
        data={"source": _csv(tmp_path, texts())}, preprocess={"transform": "tr_ingest:fn"}
    )
    before = ingest_cache_key(None, {"config": config})
    assert ingest_cache_key(None, {"config": config}) == before
    code("tr_ingest", "def fn(batch):\n    return batch.drop(columns=['text', 'x'])\n")
    assert ingest_cache_key(None, {"config": config}) != before


def test_a_splits_raw_rows_are_the_source_rows_the_transform_was_handed(tmp_path, code):
    """What a champion is re-scored on: the raw rows of this run's test split, placed by
    the transform's output as preparing placed them."""
    from trainflow.pipelines.data import prepare as preparing

    code("tr_raw", TRANSFORM)
    split = SplitConfig()
    info = inspect_source(DataConfig(source=_csv(tmp_path, texts())), transform="tr_raw:tokens")
    entry = prepare(info, split, PreprocessConfig(transform="tr_raw:tokens"), tmp_path / "cache")
    fragments = preparing.plan(info, True)
    placed = preparing.place_rows(info, split, fragments, True, kept=sum(entry.counts.values()))
    raw = pd.concat(
        [
            preparing.select_fragment(info, f, split, c, 2)
            for f, c in zip(fragments, placed.codes, strict=True)
        ]
    )
    assert list(raw.columns) == ["text", "x", "label"] and len(raw) == entry.counts["test"]
    again = entry.preprocessor.model_inputs(raw.drop(columns=["label"]))["ids"]
    prepared = _split(entry, "test")["ids"]
    assert sorted(map(tuple, again)) == sorted(map(tuple, prepared))
