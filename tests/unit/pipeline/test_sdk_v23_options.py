"""What the Kubeflow SDK 0.5.0 writes for its v2.3 options (`RuntimePatch`,
`ActiveDeadlineSeconds`) is admitted by trainyard and reaches the planned JobSet."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from fixtures.pipeline_builders import container, find, job, runtime
from trainyard.api.objects import parse_object
from trainyard.pipeline import plan, validate_trainjob

CRD = Path(__file__).resolve().parents[3] / "deploy" / "crds" / "trainer.kubeflow.org_trainjobs.yaml"


def sdk_spec() -> dict:
    from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend
    from kubeflow.trainer.options import kubernetes as o

    # The options only check the backend's type; no cluster is needed to render them.
    backend = object.__new__(KubernetesBackend)
    job_spec: dict = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                      "metadata": {"name": "sdk-job", "namespace": "default", "uid": "u"},
                      "spec": {"runtimeRef": {"name": "test-runtime", "kind": "TrainingRuntime"},
                               "trainer": {"numNodes": 2}}}
    patch = o.RuntimePatch(training_runtime_spec=o.TrainingRuntimeSpecPatch(template=o.JobSetTemplatePatch(
        metadata={"labels": {"team": "vision"}},
        spec=o.JobSetSpecPatch(replicated_jobs=[o.ReplicatedJobPatch(name="node", template=o.JobTemplatePatch(
            spec=o.JobSpecPatch(template=o.PodTemplatePatch(spec=o.PodSpecPatch(
                node_selector={"accelerator": "a100"},
                containers=[o.ContainerPatch(name="sidecar", env=[{"name": "MODE", "value": "fast"}])],
            )))))]))))
    patch(job_spec, None, backend)
    o.ActiveDeadlineSeconds(seconds=600)(job_spec, None, backend)
    return job_spec


def test_sdk_v23_options_pass_the_crd_schema_models_and_webhook() -> None:
    doc = sdk_spec()
    assert doc["spec"]["runtimePatches"][0]["manager"] == "trainer.kubeflow.org/kubeflow-sdk"
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert [e.message for e in jsonschema.Draft7Validator(json.loads(json.dumps(schema))).iter_errors(doc)] == []
    parse_object(doc, strict=True)
    rt = runtime([job("node", container("node"), container("sidecar"), ancestor="trainer")])
    assert validate_trainjob(doc, runtime=rt).allowed


def test_sdk_runtime_patch_reaches_the_jobset() -> None:
    rt = runtime([job("node", container("node"), container("sidecar"), ancestor="trainer")])
    jobset = find(plan(sdk_spec(), rt).objects, "JobSet")
    assert jobset["metadata"]["labels"] == {"team": "vision"}
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"accelerator": "a100"}
    sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
    assert sidecar["env"] == [{"name": "MODE", "value": "fast"}]
