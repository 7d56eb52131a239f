"""The tests' HTTP client. A first request to a new Serve replica, or to a Prefect server,
can take far longer than httpx's default 5 s on a busy, slow host: every request here
waits up to ``TIMEOUT_S``. A poll that retries until a deadline passes its own shorter
timeout, and its deadline is what bounds the wait."""

import httpx

TIMEOUT_S = 120.0
POLL_TIMEOUT_S = 10.0  # one attempt of a poll

http = httpx.Client(timeout=TIMEOUT_S)
