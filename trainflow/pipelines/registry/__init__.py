"""The MLflow model registry, by concern: ``store`` (where it lives: the tracking URI,
the embedded SQLite store, its lock, a client that retries while the database is
locked), ``lineage`` (a version's lineage tags and the SHA-256 of its files),
``aliases`` (``champion``, ``challenger`` and the history of their moves), ``lease`` (the
gate's turn, kept in the registry), ``versions`` (resolve a model URI, list models and
describe versions, the gate's tags read back typed, promote, roll back, load), ``gate``
(the promotion decision), ``registration`` (a checkpoint registered and gated),
``listing`` (the registry as ``trainflow models`` shows it), ``pyfunc`` (MLflow's
python_function flavor of every version), ``card`` (a version's model card) and
``reproduce`` (a version trained again from its exact config).

Each name is imported from the module that defines it."""
