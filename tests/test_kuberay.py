"""deployments/kuberay, checked offline: no Kubernetes cluster, no image built.

- Every manifest parses, and the kustomization lists them.
- The RayCluster validates against KubeRay 1.7.0's CRD schema (``openAPIV3Schema`` of
  ``ray.io/v1``, vendored in tests/data/kuberay), read strictly: a field the schema does
  not name is refused, as ``kubectl apply`` (field validation Strict) refuses it, where
  a plain JSON Schema check would let the API server drop it without a word. The CRD's
  CEL rules (``x-kubernetes-validations``) are not evaluated here.
- The work pool's base job template keeps the shape prefect-kubernetes 0.8.0's default has
  (vendored), passes the checks Prefect's server runs on ``prefect work-pool create`` and
  on a deployment's job variables, and renders, with Prefect's own templating, a Job whose
  pod validates against the same Kubernetes pod schema the CRD embeds.
- The files agree with each other and with trainflow's pins: Ray's version, the head
  service's name in the driver's RAY_ADDRESS, the token's Secret, one mount path.
- With kubectl on PATH, kubectl reads every manifest and the rendered Job. Offline that
  is all it can do: ``kubectl apply/create --dry-run=client`` ask the API server for its
  resource types first and fail with "couldn't get current server API group list";
  ``kubectl label --local`` and ``kubectl kustomize`` decode the files without one
  (YAML, apiVersion, kind), and catch no misspelt field.
"""

import copy
import json
import re
import shutil
import subprocess
import tomllib
import uuid
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
KUBERAY = REPO / "deployments" / "kuberay"
DATA = Path(__file__).resolve().parent / "data" / "kuberay"
MANIFESTS = ("namespace.yaml", "shared-storage.yaml", "raycluster.yaml")
MOUNT = "/mnt/trainflow"


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((KUBERAY / name).read_text()) if d is not None]


def raycluster() -> dict:
    return documents("raycluster.yaml")[0]


def crd_schema() -> dict:
    return json.loads((DATA / "kuberay-1.7.0-raycluster-v1-schema.json").read_text())["openAPIV3Schema"]


def job_template() -> dict:
    return json.loads((KUBERAY / "prefect-work-pool.json").read_text())


def strict(schema: dict) -> dict:
    """The schema with unknown fields refused wherever Kubernetes would refuse them: every
    object that names its properties and neither allows others nor preserves unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def schema_errors(instance: dict, schema: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(strict(schema))
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    ]


def pod_template_schema() -> dict:
    """Kubernetes' PodTemplateSpec schema, as KubeRay's CRD embeds it for the head's pod."""
    return crd_schema()["properties"]["spec"]["properties"]["headGroupSpec"]["properties"]["template"]


# Job fields that prefect-kubernetes puts in the Job's pod spec and requires there (worker.py,
# _get_base_job_manifest): no pod field. The API server drops them, with a warning, for a
# client that does not ask for strict field validation, as the worker's client does not.
PREFECT_POD_EXTRAS = {"parallelism": 1, "completions": 1}


def job_pod_errors(job: dict) -> list[str]:
    """The Job's pod template against Kubernetes' pod schema, less prefect-kubernetes' extras."""
    template = copy.deepcopy(job["spec"]["template"])
    for key, value in PREFECT_POD_EXTRAS.items():
        assert template["spec"].pop(key) == value
    return schema_errors(template, pod_template_schema())


def ray_pin() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [re.fullmatch(r"ray\[[^\]]*\]==(\S+)", d).group(1) for d in deps if d.startswith("ray[")]
    return pin


def variable_defaults(template: dict) -> dict:
    # As Prefect's worker takes them (BaseJobConfiguration._get_base_config_defaults): None is no default.
    props = template["variables"]["properties"]
    return {k: p["default"] for k, p in props.items() if p.get("default") is not None}


def deployment() -> dict:
    (dep,) = yaml.safe_load((KUBERAY / "prefect.yaml").read_text())["deployments"]
    return dep


def rendered_job(job_variables: dict | None = None) -> dict:
    """The Job manifest Prefect's templating makes of the pool's template, its defaults and
    the deployment's job variables (what the worker starts from, before it adds the flow
    run's own labels, env and command)."""
    from prefect.utilities.templating import apply_values

    template = job_template()
    values = {**variable_defaults(template), **(job_variables or deployment()["work_pool"]["job_variables"])}
    return apply_values(template["job_configuration"], values)["job_manifest"]


def containers(cluster: dict) -> list[dict]:
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


# The manifests


def test_every_manifest_parses_and_the_kustomization_lists_them():
    for name in MANIFESTS:
        for doc in documents(name):
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), name
            assert doc["metadata"]["name"], name
            if doc["kind"] != "Namespace":
                assert doc["metadata"]["namespace"] == "trainflow", name
    (kustomization,) = documents("kustomization.yaml")
    assert kustomization["resources"] == list(MANIFESTS)


def test_the_raycluster_validates_against_kuberays_crd():
    cluster = raycluster()
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert schema_errors(cluster, crd_schema()) == []


def test_the_crd_check_refuses_a_misspelt_field():
    cluster = raycluster()
    cluster["spec"]["workerGroupSpec"] = cluster["spec"].pop("workerGroupSpecs")
    cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    cluster["spec"]["authOptions"]["mode"] = "tokens"
    errors = "\n".join(schema_errors(cluster, crd_schema()))
    assert "'workerGroupSpec' was unexpected" in errors
    assert "'volumeMount' was unexpected" in errors
    assert "spec.authOptions.mode: 'tokens' is not one of ['disabled', 'token']" in errors


def test_the_raycluster_runs_trainflows_pins_with_token_auth_and_one_shared_path():
    cluster = raycluster()
    assert cluster["spec"]["rayVersion"] == ray_pin()
    base = re.search(r"^ARG BASE=(\S+)$", (KUBERAY / "Dockerfile").read_text(), re.M).group(1)
    assert base == f"rayproject/ray:{ray_pin()}-py311"  # Python 3.11, as the project's machines run
    assert cluster["spec"]["authOptions"] == {"mode": "token", "secretName": "trainflow-ray-token"}
    claim = documents("shared-storage.yaml")[0]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for group in [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]:
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        assert volumes["trainflow-shared"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    for container in containers(cluster):
        assert {"name": "trainflow-shared", "mountPath": MOUNT} in container["volumeMounts"]
        assert {"name": "TRAINFLOW_HOME", "value": f"{MOUNT}/home"} in container["env"]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"containerPort": 10001, "name": "client"} in head["ports"]


# The work pool's base job template


def test_the_job_template_keeps_prefect_kubernetes_shape():
    from prefect.server.schemas.actions import WorkPoolCreate

    ours = job_template()
    default = json.loads((DATA / "prefect-kubernetes-0.8.0-base-job-template.json").read_text())
    assert ours.keys() == default.keys() == {"job_configuration", "variables"}
    assert ours["job_configuration"].keys() == default["job_configuration"].keys()
    for key, value in default["job_configuration"].items():
        if key != "job_manifest":
            assert ours["job_configuration"][key] == value, key
    assert default["variables"]["properties"].keys() <= ours["variables"]["properties"].keys()
    # What prefect-kubernetes requires of a Job (worker.py, _get_base_job_manifest).
    manifest = ours["job_configuration"]["job_manifest"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    pod = manifest["spec"]["template"]["spec"]
    assert (pod["parallelism"], pod["completions"], pod["restartPolicy"]) == (1, 1, "Never")
    assert pod["containers"][0]["name"] == "prefect-job"
    # What `prefect work-pool create --base-job-template` sends the server, checked as the
    # server checks it: every placeholder names a variable.
    WorkPoolCreate(name="trainflow-k8s", type="kubernetes", base_job_template=ours)


def test_the_servers_check_refuses_an_undeclared_variable():
    from prefect.server.schemas.actions import WorkPoolCreate

    template = job_template()
    del template["variables"]["properties"]["ray_address"]
    with pytest.raises(ValueError, match="undeclared variable\\(s\\): ray_address"):
        WorkPoolCreate(name="trainflow-k8s", type="kubernetes", base_job_template=template)


def test_the_deployments_job_variables_pass_the_pools_schema():
    from prefect.utilities.schema_tools.validation import ValidationError, is_valid_schema, validate

    variables = job_template()["variables"]
    is_valid_schema(variables, preprocess=False)
    job_variables = deployment()["work_pool"]["job_variables"]
    # As the server validates a deployment's job variables (server/api/validation.py).
    validate({**variable_defaults(job_template()), **job_variables}, variables, raise_on_error=True,
             preprocess=True, ignore_required=True, allow_none_with_default=True)  # fmt: skip
    with pytest.raises(ValidationError, match="ray_address"):
        validate({**job_variables, "ray_address": "trainflow-head-svc:6379"}, variables, raise_on_error=True,
                 preprocess=True, ignore_required=True, allow_none_with_default=True)  # fmt: skip


def test_the_rendered_job_drives_the_cluster_from_a_pod_kubernetes_accepts():
    cluster = raycluster()
    job = rendered_job()
    assert job_pod_errors(job) == []
    assert job["metadata"]["namespace"] == cluster["metadata"]["namespace"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    name, namespace = cluster["metadata"]["name"], cluster["metadata"]["namespace"]
    assert env["RAY_ADDRESS"]["value"] == f"ray://{name}-head-svc.{namespace}.svc.cluster.local:10001"
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": cluster["spec"]["authOptions"]["secretName"],
        "key": "auth_token",
    }
    assert env["TRAINFLOW_HOME"]["value"] == f"{MOUNT}/home"
    assert container["volumeMounts"] == [{"name": "trainflow-shared", "mountPath": MOUNT}]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "trainflow-shared"
    # The driver runs the cluster's image, so Ray, Python and torch match.
    ray_images = {c["image"] for c in containers(cluster)}
    assert ray_images == {container["image"]}
    assert job["spec"]["backoffLimit"] == 0  # an evicted run is rescheduled by Prefect
    assert "cpu" not in container["resources"]["limits"]  # a null variable leaves its key out


def test_the_kuberay_deployment_runs_the_training_flow_from_the_images_checkout():
    dep = deployment()
    path, func = dep["entrypoint"].split(":")
    assert re.search(rf"^def {func}\(", (REPO / path).read_text(), re.M)
    assert (REPO / dep["parameters"]["config"]).is_file()
    workdir = re.search(r"^WORKDIR (\S+)$", (KUBERAY / "Dockerfile").read_text(), re.M).group(1)
    pull = yaml.safe_load((KUBERAY / "prefect.yaml").read_text())["pull"]
    assert pull == [{"prefect.deployments.steps.set_working_directory": {"directory": workdir}}]
    # Several pods: Ray Train's storage must be shared, which preflight accepts as a URI.
    assert f"storage=file://{MOUNT}/runs" in dep["parameters"]["overrides"]


def test_prefect_kubernetes_prepares_the_job_for_a_flow_run(request):
    """The worker's own code, where it is installed (the worker's image has it; the project
    does not depend on it). It asks Prefect's API to resolve block references: the session's
    test server answers."""
    pytest.importorskip(
        "prefect_kubernetes", reason="prefect-kubernetes (the worker's package) is not installed"
    )
    request.getfixturevalue("prefect_harness")
    import asyncio

    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    async def prepared():
        values = {
            **deployment()["work_pool"]["job_variables"],
            "env": {"MLFLOW_TRACKING_URI": "http://mlflow:5000"},
        }
        config = await KubernetesWorkerJobConfiguration.from_template_and_values(job_template(), values)
        config.prepare_for_flow_run(FlowRun(id=uuid.uuid4(), name="tidy-otter", flow_id=uuid.uuid4()))
        return config.job_manifest

    job = asyncio.run(prepared())
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MLFLOW_TRACKING_URI"]["value"] == "http://mlflow:5000"
    assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
    assert "PREFECT__FLOW_RUN_ID" in env
    assert job_pod_errors(job) == []


# kubectl, offline


@pytest.fixture
def kubectl(tmp_path):
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not on PATH")
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\n")  # no cluster, and not the user's config

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [path, *args], capture_output=True, text=True, timeout=120, env={"KUBECONFIG": str(config)}
        )

    return run


def test_kubectl_reads_every_manifest_and_the_rendered_job(kubectl, tmp_path):
    job = tmp_path / "job.yaml"
    named = {**rendered_job(), "metadata": {"name": "flow-run", "namespace": "trainflow"}}
    job.write_text(yaml.safe_dump(named))
    for path in [*(KUBERAY / name for name in MANIFESTS), job]:
        read = kubectl("label", "--local", "-f", str(path), "trainflow.check=offline", "-o", "name")
        assert read.returncode == 0 and read.stdout.strip(), f"{path.name}: {read.stderr}"
    built = kubectl("kustomize", str(KUBERAY))
    assert built.returncode == 0, built.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(built.stdout)]
    assert sorted(kinds) == ["Namespace", "PersistentVolumeClaim", "RayCluster"]
    # kustomize expands the YAML anchors the cluster's groups share.
    (cluster,) = [d for d in yaml.safe_load_all(built.stdout) if d["kind"] == "RayCluster"]
    assert cluster == raycluster()
