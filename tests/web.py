"""The tests' HTTP client. A first request to a new Serve replica, or to a Prefect server,
can take far longer than httpx's default 5 s on a busy, slow host: every request here
waits up to ``TIMEOUT_S``. A poll that retries until a deadline passes its own shorter
timeout, and its deadline is what bounds the wait."""

import httpx

TIMEOUT_S = 120.0
POLL_TIMEOUT_S = 10.0  # one attempt of a poll

http = httpx.Client(timeout=TIMEOUT_S)


def start_serve(port: int) -> None:
    """Ray Serve on the session's cluster, its proxy on loopback at ``port``. A Serve that
    an earlier test left there (its applications deleted, its proxy kept, as a run on a
    shared cluster leaves it) would keep its own port: it is shut down first."""
    from ray import serve

    from trainflow.pipelines.serving import QUIET_LOGS

    serve.shutdown()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=QUIET_LOGS)
