"""`trainyard plan` and `trainyard validate` as users run them: the real CLI in a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "plan").glob("*.yaml"))
RUNTIMES = REPO / "deploy" / "runtimes"
CRDS = [REPO / "deploy" / "crds" / name for name in (
    "jobset.x-k8s.io_jobsets.yaml", "scheduling.x-k8s.io_podgroups.yaml", "scheduling.volcano.sh_podgroups.yaml")]

TORCH_RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainingRuntime
metadata: {name: torch, namespace: default}
spec:
  mlPolicy: {numNodes: 1, torch: {numProcPerNode: auto}}
  template:
    spec:
      replicatedJobs:
      - name: node
        template:
          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
          spec: {template: {spec: {containers: [{name: node, image: img}]}}}
"""


def trainjob_yaml(name: str, trainer: str = "{}", extra: str = "") -> str:
    return f"""
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: {name}}}
spec:
  runtimeRef: {{name: torch, kind: TrainingRuntime}}
  trainer: {trainer}
{extra}"""


def trainyard(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainyard.cli.main", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, cwd=REPO)


def write(tmp_path: Path, name: str, *docs: str) -> str:
    path = tmp_path / name
    path.write_text("\n---\n".join(docs))
    return str(path)


@pytest.fixture(scope="module")
def example_plans() -> dict[str, subprocess.CompletedProcess[str]]:
    """`trainyard plan` of every shipped example, run once for the tests below."""
    return {example.stem: trainyard("plan", "-f", str(example), "--runtimes", str(RUNTIMES)) for example in EXAMPLES}


@pytest.mark.parametrize("example", [e.stem for e in EXAMPLES])
def test_every_example_plans(example: str, example_plans: dict[str, subprocess.CompletedProcess[str]]) -> None:
    result = example_plans[example]
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert objects[-1]["kind"] == "JobSet"
    assert all(o["metadata"]["ownerReferences"][0]["kind"] == "TrainJob" for o in objects)


def test_plan_output_is_stable_and_json_is_a_list(example_plans) -> None:
    args = ("plan", "-f", str(REPO / "examples/plan/torch-coscheduling-overrides.yaml"))
    first, second = example_plans["torch-coscheduling-overrides"], trainyard(*args, "--runtimes", str(RUNTIMES))
    assert first.stdout == second.stdout and first.stdout
    as_json = json.loads(trainyard(*args, "-o", "json").stdout)
    assert as_json["kind"] == "List"
    # v2.3 (the default): the runtime snapshot first; v2.1.0 has none.
    assert [o["kind"] for o in as_json["items"]] == ["ConfigMap", "PodGroup", "JobSet"]
    assert as_json["items"][0]["metadata"]["name"].endswith("-runtime-snapshot")
    v21 = json.loads(trainyard(*args, "-o", "json", "--trainer-compat", "v2.1").stdout)
    assert [o["kind"] for o in v21["items"]] == ["PodGroup", "JobSet"]
    assert as_json["items"] == list(yaml.safe_load_all(first.stdout))


def test_rejected_trainjob_prints_kubernetes_field_error_and_nothing_on_stdout(tmp_path: Path) -> None:
    path = write(tmp_path, "jobs.yaml", TORCH_RUNTIME, trainjob_yaml("good"),
                 trainjob_yaml("bad", "{numProcPerNode: foo}"))
    result = trainyard("plan", "-f", path)
    assert result.returncode == 1
    assert ('spec.trainer.numProcPerNode: Invalid value: "foo": must have an int value or [auto cpu gpu]'
            in result.stderr)
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in result.stderr
    names = [o["metadata"]["name"] for o in yaml.safe_load_all(result.stdout)]
    assert names == ["good-runtime-snapshot", "good"]
    assert "Traceback" not in result.stderr


def test_unknown_runtime_is_reported(tmp_path: Path) -> None:
    result = trainyard("plan", "-f", write(tmp_path, "job.yaml", trainjob_yaml("lonely")))
    assert result.returncode == 1 and result.stdout == ""
    assert ('spec.runtimeRef: Invalid value: {"name":"torch","kind":"TrainingRuntime","apiGroup":'
            '"trainer.kubeflow.org"}: trainingruntimes.trainer.kubeflow.org "torch" not found: specified '
            "trainingRuntime must be created before the TrainJob is created") in result.stderr


def test_kubectl_list_documents_are_expanded(tmp_path: Path) -> None:
    items = [yaml.safe_load(TORCH_RUNTIME), yaml.safe_load(trainjob_yaml("listed"))]
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    result = trainyard("plan", "-f", str(path))
    assert result.returncode == 0, result.stderr
    assert [o["metadata"]["name"] for o in yaml.safe_load_all(result.stdout)] == ["listed-runtime-snapshot", "listed"]


def test_unparseable_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", "apiVersion: v1\nkind: [oops\nmetadata: {}\n")
    result = trainyard("plan", "-f", path)
    assert result.returncode == 2
    assert f"{path}:3:" in result.stderr and "invalid YAML" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("content, message", [
    ("- just\n- a list\n", "expected a Kubernetes object"),
    ("kind: TrainJob\n", "apiVersion: Required value"),
])
def test_non_object_documents_are_user_errors(tmp_path: Path, content: str, message: str) -> None:
    result = trainyard("plan", "-f", write(tmp_path, "x.yaml", content))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_missing_file_is_a_user_error() -> None:
    result = trainyard("plan", "-f", "/nonexistent/jobs.yaml")
    assert result.returncode == 2 and "no such file" in result.stderr


def test_schema_type_error_names_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "jobs.yaml", TORCH_RUNTIME, trainjob_yaml("typed", "{numNodes: many}"))
    result = trainyard("validate", "-f", path)
    assert result.returncode == 1
    assert "spec.trainer.numNodes: Invalid value" in result.stderr and "is invalid" in result.stderr


def test_plan_from_stdin_reuses_observed_secret() -> None:
    stdin = (REPO / "examples/plan/deepspeed.yaml").read_text() + """
---
apiVersion: v1
kind: Secret
metadata: {name: ds-mpi-ssh-auth, namespace: team-a}
type: kubernetes.io/ssh-auth
"""
    result = trainyard("plan", "-f", "-", "--runtimes", str(RUNTIMES), stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert [(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(result.stdout)] == [
        ("ConfigMap", "ds-runtime-snapshot"), ("ConfigMap", "ds-mpi-hostfile"), ("JobSet", "ds")]


def test_plan_a_flux_trainjob_and_keep_its_observed_curve_secret() -> None:
    golden = REPO / "tests" / "unit" / "pipeline" / "golden" / "flux"
    stdin = (golden / "flux_distributed.runtime.yaml").read_text() + "\n---\n" \
        + (golden / "flux_distributed.trainjob.yaml").read_text()
    result = trainyard("plan", "-f", "-", stdin=stdin)
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", "lammps-flux-runtime-snapshot"), ("ConfigMap", "lammps-flux-flux-entrypoint"),
        ("Secret", "lammps-flux-flux-curve"), ("JobSet", "lammps-flux")]
    pod = objects[3]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["name"] == "flux-installer"
    assert pod["containers"][0]["command"][:2] == ["/bin/bash", "/etc/flux-config/entrypoint.sh"]
    kept = trainyard("plan", "-f", "-", stdin=stdin + """
---
apiVersion: v1
kind: Secret
metadata: {name: lammps-flux-flux-curve, namespace: hpc}
""")
    assert kept.returncode == 0, kept.stderr
    assert [o["kind"] for o in yaml.safe_load_all(kept.stdout)] == ["ConfigMap", "ConfigMap", "JobSet"]


# --- validate ---------------------------------------------------------------------------

def test_validate_accepts_good_objects(tmp_path: Path) -> None:
    result = trainyard("validate", "-f", write(tmp_path, "ok.yaml", TORCH_RUNTIME, trainjob_yaml("fine")))
    assert result.returncode == 0, result.stderr
    assert "trainjob.trainer.kubeflow.org/fine accepted (create)" in result.stdout
    assert "trainingruntime.trainer.kubeflow.org/torch accepted (create)" in result.stdout


def test_validate_a_directory_and_runtimes_dir_is_context_only() -> None:
    result = trainyard("validate", "-f", str(REPO / "examples" / "plan"), "--runtimes", str(RUNTIMES))
    assert result.returncode == 0, result.stderr
    accepted = sorted(line.split()[0] for line in result.stdout.splitlines())
    assert accepted == sorted(["trainjob.trainer.kubeflow.org/mnist", "trainjob.trainer.kubeflow.org/job1",
                               "trainingruntime.trainer.kubeflow.org/alpha", "trainjob.trainer.kubeflow.org/ds",
                               "trainjob.trainer.kubeflow.org/tune-llama", "trainjob.trainer.kubeflow.org/resnet",
                               "trainingruntime.trainer.kubeflow.org/torch-volcano",
                               "trainjob.trainer.kubeflow.org/jax-mnist", "trainjob.trainer.kubeflow.org/xgb-higgs",
                               "trainjob.trainer.kubeflow.org/patched"])


def test_validate_rejects_reserved_env(tmp_path: Path) -> None:
    job = trainjob_yaml("env", "{numProcPerNode: auto, env: [{name: PET_NODE_RANK, value: '1'}]}")
    result = trainyard("validate", "-f", write(tmp_path, "x.yaml", TORCH_RUNTIME, job))
    assert result.returncode == 1
    assert "must not have reserved envs, invalid envs configured: [PET_NODE_RANK]" in result.stderr
    assert result.stderr.startswith('Error from server (Forbidden): error when creating "')


def test_validate_warns_about_deprecated_cluster_runtime(tmp_path: Path) -> None:
    runtime = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: old-torch, labels: {trainer.kubeflow.org/support: deprecated}}
spec:
  mlPolicy: {torch: {}}
  template: {spec: {replicatedJobs: [{name: node, template: {spec: {template: {spec: {containers: [{name: node}]}}}}}]}}
"""
    job = "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\nspec: {runtimeRef: {name: old-torch}}\n"
    result = trainyard("validate", "-f", write(tmp_path, "x.yaml", runtime, job))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert warnings == [
        'Warning: ClusterTrainingRuntime "old-torch" is deprecated and will be removed in a future release of '
        "Kubeflow Trainer. See runtime deprecation policy: "
        "https://www.kubeflow.org/docs/components/trainer/operator-guides/runtime/#runtime-deprecation-policy",
        'Warning: Referenced ClusterTrainingRuntime "old-torch" is deprecated and will be removed in a future '
        "release of Kubeflow Trainer. See runtime deprecation policy: "
        "https://www.kubeflow.org/docs/components/trainer/operator-guides/runtime/#runtime-deprecation-policy"]


def test_validate_update_rules_with_old(tmp_path: Path) -> None:
    override = "  podTemplateOverrides: [{targetJobs: [{name: node}], spec: {serviceAccountName: %s}}]\n"
    old = write(tmp_path, "old.yaml", TORCH_RUNTIME, trainjob_yaml("upd", extra=override % "a"))
    new = write(tmp_path, "new.yaml", trainjob_yaml("upd", extra=override % "b"))
    result = trainyard("validate", "-f", new, "--old", old)
    assert result.returncode == 1
    assert ("spec.podTemplateOverrides: Forbidden: PodTemplateOverrides can only be modified when the TrainJob is "
            "suspended") in result.stderr
    assert 'error when updating "' in result.stderr


def test_validate_runtime_ref_immutable(tmp_path: Path) -> None:
    old = write(tmp_path, "old.yaml", TORCH_RUNTIME, trainjob_yaml("imm"))
    new = write(tmp_path, "new.yaml", TORCH_RUNTIME, trainjob_yaml("imm").replace("name: torch,", "name: other,"))
    result = trainyard("validate", "-f", new, "--old", old)
    assert result.returncode == 1
    assert ('Error from server (Invalid): error when updating "' in result.stderr
            and 'spec.runtimeRef: Invalid value: "object": field is immutable' in result.stderr)
    v21 = trainyard("validate", "-f", new, "--old", old, "--trainer-compat", "v2.1")
    assert v21.returncode == 1 and 'spec.runtimeRef: Invalid value: "object": runtimeRef is immutable' in v21.stderr
    bad = trainyard("validate", "-f", new, "--old", old, "--trainer-compat", "v9")
    assert bad.returncode != 0 and "--trainer-compat: expected one of v2.3, v2.1, got 'v9'" in bad.stderr


def test_validate_v23_trainer_rule_and_num_nodes_webhook(tmp_path: Path) -> None:
    old = write(tmp_path, "old.yaml", TORCH_RUNTIME, trainjob_yaml("v23", "{numNodes: 1, image: a}"))
    image = trainyard("validate", "-f", write(tmp_path, "image.yaml", trainjob_yaml("v23", "{numNodes: 1, image: b}")),
                      "--old", old)
    assert image.returncode == 1
    assert 'spec.trainer: Invalid value: "object": field is immutable' in image.stderr
    nodes = trainyard("validate", "-f", write(tmp_path, "nodes.yaml", trainjob_yaml("v23", "{numNodes: 2, image: a}")),
                      "--old", old)
    assert nodes.returncode == 1
    assert ('admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: spec.trainer: '
            'Invalid value: {"numNodes":2,"image":"a"}: field is immutable') in nodes.stderr


def test_plan_v23_examples_carry_the_framework_variables(example_plans) -> None:
    jax = list(yaml.safe_load_all(example_plans["jax"].stdout))[-1]
    env = {e["name"]: e.get("value") for e in
           jax["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["JAX_COORDINATOR_ADDRESS"] == "jax-mnist-node-0-0.jax-mnist:29500"
    xgb = list(yaml.safe_load_all(example_plans["xgboost"].stdout))[-1]
    env = {e["name"]: e.get("value") for e in
           xgb["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DMLC_NUM_WORKER"] == "8"
    patched = list(yaml.safe_load_all(example_plans["torch-runtime-patches"].stdout))[-1]
    assert patched["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    pod = patched["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]


def test_validate_runtime_replicated_job_rules(tmp_path: Path) -> None:
    bad = TORCH_RUNTIME.replace("- name: node\n", "- name: node\n        replicas: 2\n")
    result = trainyard("validate", "-f", write(tmp_path, "rt.yaml", bad))
    assert result.returncode == 1
    assert "spec.template.spec.replicatedJobs[0].replicas: Invalid value: 2: always must be 1" in result.stderr


# --- kubectl accepts what plan prints -----------------------------------------------------

def test_plan_output_applies_with_kubectl_client_dry_run(devcluster_module, example_plans) -> None:
    for crd in CRDS:
        devcluster_module.kubectl("apply", "--server-side", "-f", str(crd))
    for example, planned in example_plans.items():
        assert planned.returncode == 0, planned.stderr
        applied = devcluster_module.kubectl("apply", "--dry-run=client", "-f", "-", input=planned.stdout)
        kinds = [o["kind"].lower() for o in yaml.safe_load_all(planned.stdout)]
        assert applied.stdout.count("created (dry run)") == len(kinds), (example, applied.stdout)
