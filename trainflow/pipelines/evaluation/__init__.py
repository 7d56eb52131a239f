"""Evaluation and prediction: ``evaluate`` (a checkpoint over the test split, its
metrics), ``reports`` (the plots), ``predict`` (batch prediction into Parquet) and
``predict_input`` (its input and output, checked first)."""
