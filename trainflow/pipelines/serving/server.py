"""The command's side of serving: the checks before Ray starts (the model's kind, the
port, the replicas' CPUs) and :func:`serve_until_stopped`, which runs the application
until a signal. On a local cluster of its own, one replica answers HTTP on the port itself
(Serve's direct ingress) rather than behind Serve's HTTP proxy: the proxy's hop and its
callbacks cost several times the model's own work per request (benchmarks/results.md,
online serving)."""

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ray import serve

from trainflow.cluster.checks import PreflightError, check_shipped
from trainflow.cluster.session import ray_address, ray_session
from trainflow.config import PipelineConfig
from trainflow.pipelines.models.checkpoint import SPEC, read_json
from trainflow.pipelines.registry import versions
from trainflow.pipelines.serving.serve_settings import APP_NAME, DIRECT_DRAIN_S, QUIET_LOGS, SYSTEM_LOGS
from trainflow.ray_internals import local_cluster_resources, switches
from trainflow.workspace import Workspace, workspace

log = logging.getLogger("trainflow.serving")


def model_kind(model: str, ws: Workspace | None = None) -> str:
    """The ``model.kind`` of the version ``model`` names (``NAME``, ``NAME@ALIAS``, ``NAME/VERSION``)."""
    ws = ws or workspace()
    return read_json(versions.local_checkpoint(ws, versions.resolve(ws, model)), SPEC)["kind"]


def check_port(host: str, port: int) -> None:
    """PreflightError when ``host:port`` cannot be listened on (in use, not an address here)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise PreflightError(f"--host {host}: not an address of this machine ({e})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Serve's HTTP server does
        try:
            s.bind(address)
        except OSError as e:
            raise PreflightError(
                f"cannot listen on {host}:{port}: {e.strerror}; choose another --port"
            ) from None


def check_fits(
    replicas: int, cpus_per_replica: float, ray_address: str | None = None, flag: str = "--replicas"
) -> None:
    """PreflightError when the local cluster the command would start cannot hold the
    replicas: Serve would wait for them forever. A cluster elsewhere (``ray_address``,
    RAY_ADDRESS) is Serve's to schedule on."""
    if ray_address or os.environ.get("RAY_ADDRESS"):
        return
    cpus = (local_cluster_resources() or {}).get("CPU")
    if cpus is not None and replicas * cpus_per_replica > cpus + 1e-9:
        raise PreflightError(
            f"{flag} {replicas} x {cpus_per_replica:g} CPU = {replicas * cpus_per_replica:g} CPUs, "
            f"the local Ray cluster on this machine would have {cpus:g}: lower {flag}"
        )


def serve_until_stopped(
    application: serve.Application,
    *,
    host: str,
    port: int,
    on_ready: Callable[[str], None],
    ray_address: str | None = None,
    stop_after_s: float | None = None,
    model_kind: str | None = None,
    one_replica: bool = False,
) -> None:
    """Start Ray (a local cluster, or the one at ``ray_address`` or RAY_ADDRESS) and
    Serve listening on ``host:port``, run ``application`` and block until SIGINT or
    SIGTERM (or ``stop_after_s`` after it is ready); then take the application down, and
    Serve with the local cluster. ``on_ready`` gets the URL. ``model_kind``: the served
    model's (:func:`model_kind`), whose module the session ships (a user's model) and a
    cluster elsewhere checks. ``one_replica``: on a cluster this starts, the one replica
    listens on the port."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    model = {"model": {"kind": model_kind}} if model_kind else {}
    session = PipelineConfig(ray={"address": ray_address}, **model)
    direct = one_replica and _starts_local_cluster(session)
    with _environment(switches.direct_ingress_env(port, DIRECT_DRAIN_S) if direct else {}):
        with ray_session(session):
            check_shipped(log, modules=session.user_modules)
            # The proxy stays Serve's entry for handles and other applications; the port is the replica's.
            proxy_port = _free_port(host) if direct else port
            # Installed after ray.init, whose own SIGTERM handler would abort the process.
            with _signals_stop() as stop:
                serve.start(http_options={"host": host, "port": proxy_port}, logging_config=SYSTEM_LOGS)
                try:
                    serve.run(application, name=APP_NAME, route_prefix="/", logging_config=QUIET_LOGS)
                    on_ready(f"http://{_url_host(host)}:{port}")
                    _wait(stop, stop_after_s)
                finally:
                    # The application drains (requests in flight are answered) and stops; a
                    # cluster elsewhere keeps Serve for its other applications, a local one
                    # ends with the session, Serve's controller and proxy with it.
                    serve.delete(APP_NAME)


def _starts_local_cluster(session: PipelineConfig) -> bool:
    """Whether :func:`ray_session` starts a local cluster, whose processes take this
    process's environment (not a connected process, not a cluster's address)."""
    import ray

    return not ray.is_initialized() and not ray_address(session)


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment for the block, the previous ones back after."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _free_port(host: str) -> int:
    """A port on ``host`` that nothing listens on now."""
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def _signals_stop() -> Iterator[threading.Event]:
    """An event that SIGINT and SIGTERM set while the block runs, their previous handlers
    back after it. Only the main thread may install handlers: elsewhere the caller's own
    handling stands, and the event is set by nothing."""
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(stop: threading.Event, stop_after_s: float | None) -> None:
    """Until ``stop`` is set or ``stop_after_s`` has passed, waking every half second."""
    until = None if stop_after_s is None else time.monotonic() + stop_after_s
    while not stop.wait(0.5 if until is None else max(0.0, min(0.5, until - time.monotonic()))):
        if until is not None and time.monotonic() >= until:
            break


def _url_host(host: str) -> str:
    """``host`` as a URL holds it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
