"""Training on Ray Train, by concern: ``settings`` (what the workers get), ``inputs`` (the
prepared splits, in memory or streamed), ``loop`` (what every worker runs), ``progress``
(rows from the workers to the driver), ``run`` (one training run assembled:
:func:`~.run.run_training`), ``runs`` (the runs' records under storage, for ``--resume``),
``sweep`` (many runs on Ray Tune) and ``placements`` (a sweep's worker groups)."""
