"""Ray's private names that a driver reaching a cluster it did not start needs (through
Ray Client, ``ray://``, or a node's ``host:port``); the rest of the quarantine is
:mod:`trainflow.ray_internals`.

11. A worker setup hook through Ray Client (:func:`with_setup_hook`). The environment
    variable of Ray's constant ``WORKER_PROCESS_SETUP_HOOK_ENV_VAR`` (imported by
    :func:`trainflow.ray_internals.setup_hook_variable`, with Ray's other private imports), which
    ``ray.init`` sets from a runtime_env's ``worker_process_setup_hook`` in a driver on
    the cluster, and Ray Client's ``ray.init`` never does: the hook does not run in the
    workers, and their INFO lines (a report per worker per epoch) reach the console.
    Moved: the runtime_env keeps its public key; through Ray Client the hook does not
    run, and the workers' lines show.
12. Whether a cluster wants a token (:func:`wants_token`). The gRPC services of the GCS
    (``ray.core.generated.gcs_service_pb2_grpc.NodeInfoGcsService.GetClusterId``) and of
    Ray Client's server (``ray_client_pb2_grpc.RayletDriver.ClusterInfo``, a ping), called
    with no token. Without the token ``ray.init`` logs some 20 lines of ``InvalidAuthToken``
    and fails naming another address than the one given, or, through Ray Client, waits
    and fails with "ray client connection timeout". Moved: None (unknown), and
    ``ray.init`` fails as Ray makes it.
"""

from __future__ import annotations

from trainflow.ray_internals import setup_hook_variable


def with_setup_hook(runtime_env: dict) -> dict:
    """``runtime_env`` for a Ray Client ``ray.init``: its ``worker_process_setup_hook`` (a
    module path) set as the variable a driver on the cluster would set."""
    hook = runtime_env.get("worker_process_setup_hook")
    if not isinstance(hook, str):
        return runtime_env
    variable = setup_hook_variable()
    if variable is None:
        return runtime_env
    env_vars = {**runtime_env.get("env_vars", {}), variable: hook}
    return {**runtime_env, "env_vars": env_vars}


def wants_token(address: str, timeout_s: float = 5.0) -> bool | None:
    """Whether the cluster at ``host:port`` (its GCS) or ``ray://host:port`` (Ray Client's
    server) refuses a call that carries no token (token auth on); None when that cannot be
    told (Ray moved its protocol, or nothing answered)."""
    try:
        import grpc
        from ray.core.generated import (
            gcs_service_pb2,
            gcs_service_pb2_grpc,
            ray_client_pb2,
            ray_client_pb2_grpc,
        )
    except ImportError:
        return None
    client = address.startswith("ray://")
    with grpc.insecure_channel(address.removeprefix("ray://")) as channel:
        try:
            if client:
                ping = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)
                ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(ping, timeout=timeout_s)
            else:
                stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
                stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
        except grpc.RpcError as e:
            return True if e.code() == grpc.StatusCode.UNAUTHENTICATED else None
        except Exception:  # noqa: BLE001 - a protocol Ray changed: not known
            return None
    return False
