"""A registered model behind an HTTP endpoint on Ray Serve, from Python::

    from ray import serve
    import trainflow.serving

    serve.run(trainflow.serving.app("digits@champion", replicas=2))

The endpoints, batching, limits and how a replica follows its alias are described in
:mod:`trainflow.pipelines.serving`, where they live; ``trainflow models serve`` runs the
same application from the command line.
"""

from trainflow.pipelines.serving import (
    BATCH_MAX_ROWS,
    BATCH_WAIT_S,
    MAX_BODY_BYTES,
    MAX_ROWS,
    POLL_INTERVAL_S,
    ServeSettings,
    app,
)

__all__ = [
    "BATCH_MAX_ROWS",
    "BATCH_WAIT_S",
    "MAX_BODY_BYTES",
    "MAX_ROWS",
    "POLL_INTERVAL_S",
    "ServeSettings",
    "app",
]
