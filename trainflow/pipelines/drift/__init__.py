"""Drift: how far new data moved from the rows a registered version was trained on, for
a run whose config has a ``drift`` section and for what a served model is asked.

By concern: ``compare`` (two profiles scored feature by feature, PSI and SciPy's KS
test; the report, its plot, the champion's profile; ``DataDrift``) and ``samples`` (the
bounded sample of requests each serving replica keeps, read back and scored against the
champion: :func:`~.samples.served_drift`). The reference is the train split's profile,
built by every preparation (:mod:`trainflow.pipelines.data.profile`)."""
