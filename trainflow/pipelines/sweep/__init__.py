"""Sweeps on Ray Tune, by concern: ``run`` (the Tuner assembled and run, each trial's
trainable, every trial summarized and the best picked: :func:`~.run.run_sweep`),
``search`` (the search space, and the search algorithm and trial scheduler looked up by
name in a table each) and ``trials`` (what one trial does and reports: its epochs to Tune,
its events, its worker groups' placement groups)."""
