"""The MLflow model registry, by concern: ``store`` (where it lives: the tracking URI,
the embedded SQLite store, its lock, a client that retries while the database is
locked, and the gate's lease, kept in the registry), ``lineage`` (a version's lineage
tags, the SHA-256 of its files, its checkpoint on this machine), ``versions`` (resolve a
model URI, list models and describe versions, the gate's tags read back typed, promote,
roll back, load, and the registry as ``trainflow models`` shows it), ``gate`` (the
promotion decision, and ``champion``, ``challenger`` and the history of their moves),
``registration`` (a checkpoint registered and gated), ``pyfunc`` (MLflow's
python_function flavor of every version), ``card`` (a version's model card) and
``reproduce`` (a version trained again from its exact config).

Each name is imported from the module that defines it."""
