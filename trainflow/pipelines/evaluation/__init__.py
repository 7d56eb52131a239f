"""Evaluation and prediction: ``evaluate`` (a checkpoint over the test split, its
metrics), ``reports`` (the plots), ``drift`` (new data against a model's train split),
``predict`` (batch prediction into Parquet) and ``predict_input`` (its input and output,
checked first)."""
