"""Serving's settings and their defaults: what a request may hold, how requests batch,
how many a replica holds and how replicas scale, how often an alias is asked about; the
name and log levels the application runs under. :class:`ServeSettings` carries the
ones each replica is told."""

from dataclasses import dataclass

# Rows (or images) one request may hold, and the bytes of its body.
MAX_ROWS = 1024
MAX_BODY_BYTES = 8 << 20
# Pixels of one decoded image: a small compressed file may declare an enormous image.
MAX_IMAGE_PIXELS = 4096 * 4096
# A batch: at most this many rows through the model in one pass, formed from the requests
# that arrive within BATCH_WAIT_S of the first. At least MAX_ROWS, so a full request fits.
BATCH_MAX_ROWS = 1024
BATCH_WAIT_S = 0.002
# Requests a replica holds at once (in its batch queue and in the model): above the
# concurrent clients a batch gathers from (the busiest level of benchmarks/results.md,
# online serving), so they queue in the replica, where they batch, rather than in Serve's
# proxy. Serve's default, 5, would cap a batch at 5 requests.
MAX_ONGOING_REQUESTS = 64
# With --max-replicas, Serve adds a replica while each holds more than this many requests
# on average, and removes one when they hold fewer (its autoscaling policy).
TARGET_ONGOING_REQUESTS = 16
# How often a replica asks the registry where its alias points.
POLL_INTERVAL_S = 2.0
# How long a replica answering HTTP itself (one replica, on a local cluster) keeps its port
# open once told to stop, for requests in flight: no load balancer stands in front to drain.
DIRECT_DRAIN_S = 0.5
# The Serve application serve_until_stopped runs, and deletes when it stops.
APP_NAME = "trainflow"
# Serve's controller, proxy and replicas log every request and deployment step at INFO;
# the command prints its own lines. The application's replicas keep their warnings
# (trainflow's among them).
QUIET_LOGS = {"log_level": "WARNING", "enable_access_log": False}
# Serve's controller and proxies: their warnings are of Serve's own upkeep (on a busy
# machine, a replica's queue length asked for and given late, which Serve asks again), and
# a start that fails raises in the command.
SYSTEM_LOGS = {"log_level": "ERROR", "enable_access_log": False}


@dataclass(frozen=True)
class ServeSettings:
    """What each replica is told, besides the model: limits, batching, polling."""

    max_rows: int = MAX_ROWS
    max_body_bytes: int = MAX_BODY_BYTES
    batch_max_rows: int = BATCH_MAX_ROWS
    batch_wait_s: float = BATCH_WAIT_S
    poll_interval_s: float = POLL_INTERVAL_S

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_body_bytes < 1:
            raise ValueError("max_rows and max_body_bytes must be at least 1")
        if self.batch_max_rows < self.max_rows:
            raise ValueError(
                f"batch_max_rows {self.batch_max_rows} is below max_rows {self.max_rows}: "
                "a full request must fit in one batch"
            )
        if self.batch_wait_s < 0 or self.poll_interval_s <= 0:
            raise ValueError("batch_wait_s must be >= 0 and poll_interval_s > 0")
