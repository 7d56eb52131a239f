"""Writes this folder with trainflow 0.2.0's own code: run it from a checkout of that
release, ``PYTHONPATH=. python make_fixture.py OUT``."""

import json
import sys
import tempfile
from pathlib import Path

import torch

import trainflow
from trainflow.config import load_config
from trainflow.pipelines.data.prepare import prepare
from trainflow.pipelines.data.schema import inspect_source
from trainflow.pipelines.data.sources import digits_frame
from trainflow.pipelines.models.build import build_model, model_spec
from trainflow.pipelines.models.checkpoint import save_checkpoint

assert trainflow.__version__ == "0.2.0", trainflow.__version__
out = Path(sys.argv[1])
config = load_config({"model": {"kind": "cnn", "channels": [8], "hidden_sizes": [16]}})
with tempfile.TemporaryDirectory() as tmp:
    entry = prepare(inspect_source(config.data), config.data.split, config.preprocess, Path(tmp))
pre = entry.preprocessor
spec = model_spec(config.model, pre.num_features, len(pre.classes))
torch.manual_seed(0)
model = build_model(spec)
frame = digits_frame()
x = torch.from_numpy(pre.features(frame))
y = torch.from_numpy(pre.labels(frame["label"]))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for _ in range(60):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
model.eval()
metrics = {"epoch": 1, "train_loss": float(loss.detach())}
config_json = config.model_dump(mode="json")
save_checkpoint(out, model=model, spec=spec, preprocessor=pre.to_dict(), config=config_json, metrics=metrics)
rows = list(range(0, 1797, 60))
with torch.no_grad():
    proba = torch.softmax(model(x[rows]), dim=1).numpy()
expected = {"rows": rows, "predicted": [int(i) for i in proba.argmax(1)], "proba": proba.round(6).tolist()}
(out / "expected.json").write_text(json.dumps(expected))
