"""What keeps a run's console to what a user acts on: the environment trainflow's own
processes and Ray workers get, the setup hook of every Ray worker, and Ray Data's
console settings."""

from __future__ import annotations

import logging
import os
import re
import sys

from trainflow import ray_internals
from trainflow.ray_internals import switches

# Set for trainflow's own processes and handed to every Ray worker. Each one is a
# default: a value already in the environment wins.
QUIET_ENV = {
    # Telemetry cannot leave these machines; offline it logs errors users take for failures.
    "RAY_USAGE_STATS_ENABLED": "0",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # Each ray.train.report() waits about one controller poll, so Ray's default interval
    # (2 s) adds up over a run's epochs. The controller polls every worker at this rate:
    # on a cluster of hundreds of workers, set it higher.
    switches.TRAIN_HEALTH_CHECK_INTERVAL: "0.05",
    # Against an MLflow server, MLflow prints each ended run's and its experiment's URLs on
    # stdout; trainflow's summary links the registered version.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    # Tune's output engine prints its experiment box and a TensorBoard command even at
    # verbose=0; its legacy reporter prints nothing, and a sweep logs each trial itself. In
    # the workers too: through Ray Client, Tune's loop runs in an actor on the cluster.
    switches.TUNE_NEW_OUTPUT: "0",
    # MLflow retries a call to its server 7 times with backoff, about 4 minutes, and the
    # register step is retried twice more: a server that went down is reported in about a
    # minute instead of twelve.
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    # MLflow draws a progress bar per artifact copy; trainflow logs the step instead.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # MLflow sets its loggers to INFO when imported, and announces the embedded store's
    # table creation and migrations there: nothing a user acts on.
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


# Set when trainflow starts a local cluster; a value already in the environment wins.
LOCAL_CLUSTER_ENV = {
    # Train V2's preemption watcher (an early warning that a node is being drained)
    # starts an actor that Ray core reports as an ERROR line on every run (ray issue
    # 53727); one local node is never drained.
    switches.TRAIN_PREEMPTION_WATCHER: "0",
    # Ray starts an idle worker per CPU when the first driver connects, and a run uses
    # none: Ray Train's actors have a runtime_env of their own, which an idle worker cannot
    # take, and a small input is prepared in the driver. A task that needs a worker starts one.
    switches.PRESTART_WORKERS: "0",
    # Ray starts its workers 15 steps of CPU priority below the cluster's starter, so any
    # other process takes the CPU from training first. A run's workers keep the driver's
    # priority, as Ray's job manager gives a job's driver; a cluster of the user's own keeps
    # Ray's setting (docs/guides/clusters.md).
    switches.WORKER_NICENESS: "0",
}


def apply_quiet_env() -> dict[str, str]:
    """Set QUIET_ENV defaults in this process; return the values in force."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in QUIET_ENV}


class _TokenAuthNotice(logging.Filter):
    """Ray keeps token authentication on for a local cluster it starts, and says so on
    every start unless RAY_AUTH_MODE was set before ray was imported. trainflow keeps it
    on (the cluster's ports listen on every interface, and without a token anyone who
    reaches them runs code) and drops the notice; Ray's warning that auth is off stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def quiet_token_auth_notice() -> None:
    """Drop Ray's notice that a local cluster keeps token auth on (it stays on)."""
    logger = logging.getLogger(ray_internals.TOKEN_AUTH_LOGGER)
    if not any(isinstance(f, _TokenAuthNotice) for f in logger.filters):
        logger.addFilter(_TokenAuthNotice())


def quiet_worker() -> None:
    """Runs in every Ray worker process of a trainflow run (a ``worker_process_setup_hook``).

    Points Ray's helpers in the worker at its own cluster, has Train's placement-group
    cleaner ask that cluster's GCS whether a controller lives
    (:func:`~trainflow.ray_internals.answer_cleaner_from_gcs`), and keeps off the console
    what no user acts on: the records of the loggers :mod:`trainflow.ray_internals` lists
    (use 8), expected tracebacks (:class:`_NoExpectedTrainErrors`), and the warnings Ray's
    internals trip."""
    import warnings

    import ray

    # Ray's helpers inside a worker (the state API, Ray Client) find their cluster by
    # RAY_ADDRESS, else by the last cluster started on this machine: on a machine running
    # several (tests, shared hosts) another one, or a dead one that they wait on. Name
    # this worker's own cluster.
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    ray_internals.answer_cleaner_from_gcs()
    for name in ray_internals.ERRORS_ONLY_LOGGERS:
        _errors_only(name)
    logging.getLogger(ray_internals.train_report_logger()).setLevel(logging.WARNING)
    logging.getLogger(ray_internals.DATA_PROGRESS_LOGGER).setLevel(logging.ERROR)
    logging.getLogger(ray_internals.STREAMING_EXECUTOR_LOGGER).setLevel(logging.WARNING)
    train_errors = logging.getLogger(ray_internals.TRAIN_ERRORS_LOGGER)
    if not any(isinstance(f, _NoExpectedTrainErrors) for f in train_errors.filters):
        train_errors.addFilter(_NoExpectedTrainErrors())
    controller = logging.getLogger(ray_internals.TRAIN_CONTROLLER_LOGGER)
    if not any(isinstance(f, _StartupTimeoutInOneLine) for f in controller.filters):
        controller.addFilter(_StartupTimeoutInOneLine())
    score = logging.getLogger(ray_internals.CHECKPOINT_SCORE_LOGGER)
    if not any(isinstance(f, _NoMissingScore) for f in score.filters):
        score.addFilter(_NoMissingScore())
    # Tune's own lines, where its loop runs in a worker (through Ray Client): a sweep logs
    # each trial itself, as in the driver (pipelines/sweep/run.py).
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.")
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class _NoExpectedTrainErrors(logging.Filter):
    """Drops Ray Train's "Error in training function" record where the driver reports the
    failure in one line and the traceback stays in the worker's log: trainflow's ConfigError
    or DataError; a collective call's error once its peer is gone (a lost worker or node,
    whose group Ray Train restarts); and a report's wait on its run's synchronization actor
    once the run's controller or placement group is gone (a trial Tune stopped or PBT
    paused)."""

    # The traceback's last line: the error's qualified class name and message.
    EXPECTED = re.compile(r"trainflow(\.\w+)*\.(ConfigError|DataError): ")
    LOST_PEER = re.compile(r"RuntimeError: .*\b(gloo|NCCL|nccl)\b.*Connection (reset|closed) by peer")
    OWNER_GONE = "The actor is dead because its owner has died."
    GROUP_GONE = "Destroying worker since its placement group was removed."

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Error in training function"):
            return True
        last = message.rstrip().rsplit("\n", 1)[-1]
        controller_gone = "class_name: SynchronizationActor" in message and (
            last.startswith(self.OWNER_GONE) or self.GROUP_GONE in last
        )
        return not (self.EXPECTED.match(last) or self.LOST_PEER.match(last) or controller_gone)


class _StartupTimeoutInOneLine(logging.Filter):
    """Ray Train's controller logs a worker group that did not start in time as an error
    with its traceback, and tries again: what an elastic run does when it shrinks (it
    first tries the size it had, then the size that fits). Kept as one warning line.
    A trainflow error its callbacks raise there (a user's loop without the
    checkpoint.metric the config names) is dropped: the driver reports it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if _NoExpectedTrainErrors.EXPECTED.match(f"{type(error).__module__}.{type(error).__name__}: "):
            return False
        if type(error).__name__ == "WorkerGroupStartupTimeoutError":
            first = str(error).split(". ", 1)[0]
            record.msg = f"{first}; Ray Train tries again"
            record.args = None
            record.levelno = logging.WARNING
            record.levelname = "WARNING"
            record.exc_info = record.exc_text = None
        return True


class _NoMissingScore(logging.Filter):
    """Drops Ray Train's error line for each checkpoint of a user's loop reported without
    the checkpoint.metric: trainflow says it once (``user_loop.training_result``), or stops the
    run at the first such checkpoint where the config names the metric (``LoopReports``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Result dict has no key:")


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def _errors_only(name: str) -> None:
    """Keep only a logger's errors. A filter rather than a level: Ray Train configures
    the ``ray.train`` loggers in its controller process (``logging.config.dictConfig``),
    which resets the level of every logger below them, and keeps their filters."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _ErrorsOnly) for f in logger.filters):
        logger.addFilter(_ErrorsOnly())


def configure_ray_data() -> None:
    """Ray Data settings for trainflow's driver: a cheap shuffle; progress bars on a
    terminal and plain logs elsewhere (CI, Prefect workers)."""
    from ray.data import DataContext
    from ray.data.context import ShuffleStrategy

    ctx = DataContext.get_current()
    # The default hash shuffle starts a pool of aggregator actors for every groupby,
    # unique and aggregate, and starting them outlasts the whole sort-based shuffle of a
    # small dataset.
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    interactive = sys.stderr.isatty()
    ctx.enable_progress_bars = interactive
    ctx.print_on_execution_start = interactive
    if not interactive:
        # One INFO line per Dataset execution, and a warning that the bars are off;
        # trainflow's step logs say what ran.
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        logging.getLogger(ray_internals.DATA_PROGRESS_LOGGER).setLevel(logging.ERROR)


class _NoThreadNotice(logging.Filter):
    """Ray Client's server connects each client's job from a thread of its own, and Ray
    warns that it sets no SIGTERM handler there; the warning reaches the client's console
    through its log stream, on every run. trainflow handles a run's signals itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("SIGTERM handler is not set")


def quiet_ray_client() -> None:
    """Drop Ray Client's notices that a user cannot act on (see :class:`_NoThreadNotice`)."""
    stream = logging.getLogger("ray.util.client.logsclient")
    if not any(isinstance(f, _NoThreadNotice) for f in stream.filters):
        stream.addFilter(_NoThreadNotice())


def command_logger() -> logging.Logger:
    """INFO lines of the command itself on stderr, in the look of Prefect's."""
    logger = logging.getLogger("trainflow.cli")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s.%(msecs)03d | %(levelname)-7s | trainflow - %(message)s", "%H:%M:%S"
            )
        )
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger
