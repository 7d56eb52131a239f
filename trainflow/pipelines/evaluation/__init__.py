"""Evaluation and prediction: ``evaluate`` (a checkpoint over the test split, its
metrics), ``predict`` (batch prediction into Parquet) and ``reports`` (the plots)."""
