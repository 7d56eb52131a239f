"""Training on Ray Train, by concern: ``settings`` and ``worker_settings`` (what the
workers get), ``inputs`` (the prepared splits, in memory or streamed), ``loop`` (what every
worker runs), with ``optim``, ``losses`` and ``val_metrics``; ``progress`` (rows from the
workers to the driver), ``resume`` (where a run resumes from), ``run`` (one training run
assembled: :func:`~.run.run_training`), ``run_records`` (the runs under storage, for
``--resume``), ``in_process`` (a run without Ray Train's workers), ``user_loop`` and
``loop_reports`` (a training function of the user's own). Sweeps on Ray Tune are in
:mod:`trainflow.pipelines.sweep`."""
