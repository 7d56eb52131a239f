"""What a cluster needs beyond resources, checked before training: an address that
answers, the same versions on its workers, a model module they import, storage its
nodes share."""

import pytest

from tests.cluster.hang import answers
from trainflow.cluster.checks import PreflightError


def test_a_single_node_shares_its_own_disk_and_is_not_asked(ray_cluster, tmp_path):
    """The shared storage check (a marker task per node) costs nothing on one node: a
    folder no node could write into passes, since nothing is written."""
    from trainflow.cluster.checks import alive_nodes, check_shared

    assert len(alive_nodes()) == 1
    check_shared({"storage": str(tmp_path / "missing" / "runs")})
    assert not (tmp_path / "missing").exists()


def test_the_versions_check_reads_a_workers_python_ray_and_torch(ray_cluster):
    from importlib import metadata

    import ray

    from trainflow.cluster.checks import check_versions

    seen = check_versions(ray.get_runtime_context().gcs_address)
    assert seen["torch"] == metadata.version("torch") and seen["Ray"] == ray.__version__


def test_the_versions_check_refuses_a_model_module_the_clusters_workers_cannot_import(ray_cluster):
    import ray

    from trainflow.cluster.checks import check_versions

    address = ray.get_runtime_context().gcs_address
    assert check_versions(address, modules={"json": "model.kind"})["module_errors"] == {}
    with pytest.raises(PreflightError) as refused:
        check_versions(address, modules={"trainflow_test_absent_net": "model.kind"})
    assert str(refused.value) == (
        f"model.kind: a worker of the Ray cluster at {address} cannot import trainflow_test_absent_net, "
        "which the job ships: ModuleNotFoundError: No module named 'trainflow_test_absent_net'; install "
        "what it imports on the cluster's nodes"
    )


def test_an_address_where_no_cluster_answers_fails_at_once():
    """ray_session checks an address before ray.init, which would retry it for minutes."""
    import socket

    from trainflow.cluster.checks import check_reachable

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(
        PreflightError, match=rf"no Ray cluster answers at 127\.0\.0\.1:{port} .*ray start --head"
    ):
        answers(lambda: check_reachable(f"127.0.0.1:{port}"))
    with pytest.raises(PreflightError, match=r"'head-node' .* is not host:port"):
        check_reachable("head-node")
    check_reachable("ray://head:10001")  # Ray Client addresses are left to Ray


def test_a_cluster_that_wants_a_token_from_a_driver_without_one_is_one_line(ray_cluster, monkeypatch):
    """The session's cluster keeps Ray's token auth on; a driver whose environment does not
    say RAY_AUTH_MODE=token is told so before ray.init, which would log some 20 lines."""
    import ray

    from trainflow.cluster.checks import check_reachable

    address = ray.get_runtime_context().gcs_address
    check_reachable(address)  # this process has the token
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(PreflightError) as refused:
        check_reachable(address)
    assert str(refused.value) == (
        f"the Ray cluster at {address} wants a token (its token auth is on): export RAY_AUTH_MODE=token "
        "and the cluster's token as RAY_AUTH_TOKEN, or in the file RAY_AUTH_TOKEN_PATH names (default "
        "~/.ray/auth_token)"
    )
