"""Training on Ray Train, by concern: ``settings`` (what the workers get), ``inputs`` (the
prepared splits, in memory or streamed), ``loop`` (what every worker runs), ``progress``
(rows from the workers to the driver), ``placements`` (a sweep's worker groups), and
``run`` (one training run assembled: :func:`~.run.run_training`)."""
