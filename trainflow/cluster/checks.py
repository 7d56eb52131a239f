"""What a cluster needs beyond resources, checked before training: on a cluster the run did
not start, the driver's Python, Ray and torch, and the user's model module importable
there; on several nodes, the run's storage and cache shared by every node; an address
that answers; a cache at a URI that takes writes."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from trainflow.cluster.session import PreflightError, current_session, trainflow_package
from trainflow.config import PipelineConfig
from trainflow.files import filesystem, is_uri, join, redacted, write_text
from trainflow.ray_internals.client import wants_token
from trainflow.workspace import cache_location, storage_location

log = logging.getLogger("trainflow")


def check_cluster(config: PipelineConfig, logger: logging.Logger | logging.LoggerAdapter = log) -> None:
    """What a cluster needs beyond resources: on one the run did not start, the same
    Python, Ray and torch as this driver (:func:`check_versions`); on several nodes, the
    run's storage and the prepared-split cache shared by all of them (:func:`check_shared`).
    Each check passes once per session."""
    check_shipped(logger, modules=config.user_modules)
    nodes = alive_nodes()
    folders = shared_folders(config)
    key = ("shared", tuple(sorted(folders.items())), tuple(sorted(nodes)))
    session = current_session()
    if len(nodes) > 1 and (session is None or key not in session.verified):
        check_shared(folders, nodes)
        if session is not None:
            session.verified.add(key)


def check_shipped(
    logger: logging.Logger | logging.LoggerAdapter = log, modules: Mapping[str, str] | None = None
) -> None:
    """On a cluster the session did not start (trainflow shipped to it), the versions and
    the user's ``modules`` checked there (:func:`check_versions`), once per session;
    nothing on a local cluster."""
    session = current_session()
    key = ("versions", tuple(sorted(modules or {})))
    if session is None or not session.shipped or key in session.verified:
        return
    check_versions(session.address, logger, modules=modules)
    session.verified.add(key)


def alive_nodes() -> dict[str, str]:
    """The cluster's alive nodes: node id and address."""
    import ray

    return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes() if n.get("Alive")}


def _versions(modules: Iterable[str] = ()) -> dict[str, Any]:
    """This process's Python (major.minor), Ray and torch versions, where it imports
    trainflow from, and the error importing each of ``modules`` raised, by module (none:
    each imported). torch's version is its installed distribution's, read without importing torch
    (a slow import): the version pip installed, which torch reports too."""
    from importlib import metadata

    import ray

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    module_errors = {}
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - whatever the import raised is the answer
            module_errors[module] = f"{type(e).__name__}: {_first_line(e)}"
    return {
        "Python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "Ray": ray.__version__,
        "torch": torch,
        "trainflow": trainflow_package(),
        "module_errors": module_errors,
    }


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def check_versions(
    address: str,
    logger: logging.Logger | logging.LoggerAdapter = log,
    timeout_s: float = 120.0,
    modules: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """PreflightError unless a worker of the cluster at ``address``, started with the job's
    runtime_env, runs this driver's Python (major.minor), Ray and torch: another torch or Ray
    release fails mid-run or worse. With ``modules`` (the user's shipped modules, each with
    the config field naming it), also unless that worker imports each, so what they import
    is installed there. Returns what the worker reported."""
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    try:
        theirs = ray.get(ray.remote(num_cpus=0)(_versions).remote(list(modules or {})), timeout=timeout_s)
    except GetTimeoutError:
        raise PreflightError(
            f"no worker of the Ray cluster at {address} started within {timeout_s:g} s to report its "
            "versions: is the cluster overloaded, or its runtime_env setup stuck (see the raylet's logs)?"
        ) from None
    except RayError as e:
        raise PreflightError(
            f"a worker of the Ray cluster at {address} failed to start with trainflow shipped to it: "
            f"{_first_line(e)}"
        ) from None
    ours = _versions()
    for name in ("Python", "Ray", "torch"):
        if theirs[name] != ours[name]:
            raise PreflightError(
                f"the Ray cluster at {address} runs {name} {theirs[name] or '(not installed)'}, this driver "
                f"{ours[name]}: install the same versions on both"
            )
    for module, error in theirs["module_errors"].items():
        raise PreflightError(
            f"{(modules or {})[module]}: a worker of the Ray cluster at {address} cannot import {module}, "
            f"which the job ships: {error}; install what it imports on the cluster's nodes"
        )
    logger.info(
        "the Ray cluster at %s runs Python %s, Ray %s and torch %s as this driver does; its workers "
        "import trainflow from %s",
        address,
        theirs["Python"],
        theirs["Ray"],
        theirs["torch"],
        theirs["trainflow"],
    )
    return theirs


def shared_folders(config: PipelineConfig) -> dict[str, str]:
    """The folders every node of a cluster writes and this driver reads, by the name a
    user sets them with: Ray Train's runs (``storage``) and the prepared splits (the cache)."""
    storage = storage_location(config)
    return {
        "storage": storage if is_uri(storage) else os.path.abspath(storage),
        "cache": cache_location(config),
    }


# Where a user sets each shared folder, for the message when one is not shared.
_FOLDER_SETTINGS = {
    "storage": "set storage to",
    "cache": "set cache to",
}


MARKERS = ".trainflow-preflight-"


def _write_markers(folders: dict[str, str], token: str) -> dict[str, str]:
    """Runs on one node: writes a marker holding the node's id into each folder's marker
    folder, which the driver made; returns the error per folder it could not write in.
    The marker folder is not created here: a node without the shared mount would
    create a folder of its own and write there, unseen."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    errors = {}
    for name, folder in folders.items():
        try:
            fs, path = filesystem(folder)
            with fs.open_output_stream(f"{path}/{MARKERS}{token}/{node}") as out:
                out.write(node.encode())
        except Exception as e:  # noqa: BLE001 - any failure to write is the answer
            errors[name] = f"{type(e).__name__}: {_first_line(e)}"
    return errors


def check_shared(
    folders: dict[str, str], nodes: dict[str, str] | None = None, timeout_s: float = 120.0
) -> None:
    """PreflightError, naming the folder and the node, unless a task pinned on each alive node
    writes a marker into each of ``folders`` (name: path or URI) that this driver reads back:
    checkpoints and the cache are written on one node and read on others. A single node is
    not checked. ``nodes``: node id to address; by default the alive nodes
    (:func:`alive_nodes`)."""
    import secrets

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes() if nodes is None else nodes
    if len(nodes) < 2:
        return
    token = secrets.token_hex(6)
    made: list = []
    try:
        _make_marker_folders(folders, token, made)
        task = ray.remote(num_cpus=0, max_retries=0)(_write_markers)
        refs = {
            node: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                folders, token
            )
            for node in nodes
        }
        for node, ref in refs.items():
            where = f"Ray node {node} ({nodes[node]})"
            errors = _markers_written(ref, where, folders, timeout_s)
            for name, folder in folders.items():
                _check_marker_seen(name, folder, token, node, where, errors.get(name))
    finally:
        for fs, marker_folder in made:
            try:
                fs.delete_dir(marker_folder)
            except OSError:
                pass


def _make_marker_folders(folders: dict[str, str], token: str, made: list) -> None:
    """Create each folder's marker folder from this driver, adding each to ``made`` (the
    filesystem and path, for removal) as it is made; PreflightError for a folder this
    driver cannot write into."""
    for name, folder in folders.items():
        fs, path = filesystem(folder)
        try:
            fs.create_dir(f"{path}/{MARKERS}{token}")
        except OSError as e:
            raise PreflightError(
                f"{name} {folder} is not writable from this driver: {_first_line(e)}"
            ) from None
        made.append((fs, f"{path}/{MARKERS}{token}"))


def _markers_written(ref, where: str, folders: dict[str, str], timeout_s: float) -> dict[str, str]:
    """What the marker task on the node ``where`` answered: the error per folder it could
    not write in. PreflightError when it did not answer or did not run."""
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    try:
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        raise PreflightError(
            f"{where} did not answer within {timeout_s:g} s when asked to write into "
            f"{', '.join(folders.values())}"
        ) from None
    except RayError as e:
        raise PreflightError(f"{where} could not run the shared storage check: {_first_line(e)}") from None


def _check_marker_seen(name: str, folder: str, token: str, node: str, where: str, error: str | None) -> None:
    """PreflightError unless the node ``where`` wrote its marker into ``folder`` (``error``:
    why it could not) and this driver reads it back there."""
    if error is not None:
        raise PreflightError(
            f"{name} {folder} is not reachable from {where}: {error}; "
            f"{_FOLDER_SETTINGS.get(name, 'set it to')} a folder every node and this driver "
            "mount at the same path, or shared storage"
        )
    fs, path = filesystem(folder)
    try:
        with fs.open_input_stream(f"{path}/{MARKERS}{token}/{node}") as marker:
            seen = marker.read().decode() == node
    except (OSError, FileNotFoundError):
        seen = False
    if not seen:
        raise PreflightError(
            f"{name} {folder} is not shared: {where} wrote a marker there that this driver "
            f"does not see; {_FOLDER_SETTINGS.get(name, 'set it to')} a folder every node and "
            "this driver mount at the same path, or shared storage"
        )


def check_cache(config: PipelineConfig) -> None:
    """A cache at a URI answers and takes writes (a marker written and removed), before
    anything starts: a wrong bucket, endpoint or credentials fail here, in one line,
    rather than in the first Ray task that writes a split."""
    import uuid

    location = cache_location(config)
    if not is_uri(location):
        return
    marker = join(location, f"{MARKERS}{uuid.uuid4().hex[:8]}")
    try:
        fs, path = filesystem(marker)
        fs.get_file_info(path)  # one request first: an endpoint that is not there fails once
        write_text(marker, "")
        fs.delete_file(path)
    except (OSError, ValueError) as e:  # pyarrow's errors for a store it cannot reach or parse
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PreflightError(
            f"cache: cannot write to {redacted(location)}: {reason}; check the address and the "
            "credentials, or leave cache out for TRAINFLOW_HOME/cache"
        ) from None


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """PreflightError when nothing answers at a cluster's ``host:port``: ``ray.init``
    itself retries such an address for minutes; and when the cluster wants a token this
    driver lacks. A Ray Client address (``ray://``) is checked for the token only, and
    ``auto`` is left to Ray."""
    import socket

    if address.startswith("ray://"):
        _check_token(address, timeout_s)
        return
    if "://" in address or address == "auto":
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise PreflightError(
            f"Ray address {address!r} (ray.address or RAY_ADDRESS) is not host:port such as 10.0.0.5:6379"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise PreflightError(
            f"no Ray cluster answers at {address} (ray.address or RAY_ADDRESS): {e}; start one "
            "there with `ray start --head`, or unset both to run on a local cluster of the run's own"
        ) from None
    _check_token(address, timeout_s)


def _check_token(address: str, timeout_s: float) -> None:
    """PreflightError when the cluster at ``address`` wants a token and this driver's
    environment does not say RAY_AUTH_MODE=token."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token" and wants_token(address, timeout_s):
        raise PreflightError(
            f"the Ray cluster at {address} wants a token (its token auth is on): export "
            "RAY_AUTH_MODE=token and the cluster's token as RAY_AUTH_TOKEN, or in the file "
            "RAY_AUTH_TOKEN_PATH names (default ~/.ray/auth_token)"
        )
