"""Upstream v2.3.0 behaviour as table tests (written from its facts): the new CEL rules, the
runtimePatches webhook rules and merge, torch envInjection, JAX and XGBoost."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from fixtures.pipeline_builders import container, env_of, find, job, runtime, torch_runtime, trainjob
from trainyard.pipeline import PlanningError, validate_runtime, validate_trainjob
from fixtures.pipeline_builders import plan_past_snapshot as plan  # the plugins' objects (test_snapshot.py)


KUEUE = "kueue.x-k8s.io/manager"


def with_spec(job_doc: dict[str, Any], **spec: Any) -> dict[str, Any]:
    changed = copy.deepcopy(job_doc)
    changed["spec"].update(spec)
    return changed


def node_runtime(ml_policy: dict[str, Any] | None = None, *extra_containers: dict[str, Any],
                 init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    pod = {"initContainers": init} if init else None
    return runtime([job("node", container("node"), *extra_containers, ancestor="trainer", pod=pod)],
                   ml_policy=ml_policy)


def patch(manager: str = KUEUE, job_name: str = "node", pod_spec: dict[str, Any] | None = None,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"replicatedJobs": [
        {"name": job_name, "template": {"spec": {"template": {"spec": pod_spec or {}}}}}]}}
    if labels:
        template["metadata"] = {"labels": labels}
    return {"manager": manager, "trainingRuntimeSpec": {"template": template}}


# --- CRD rules (HTTP 422) -------------------------------------------------------------------

@pytest.mark.parametrize("old_trainer, new_trainer, texts", [
    pytest.param({"numNodes": 1, "image": "a"}, {"numNodes": 1, "image": "b"},
                 ['spec.trainer: Invalid value: "object": field is immutable'], id="image"),
    pytest.param({"args": ["x"]}, {}, ['spec.trainer: Invalid value: "object": field is immutable'], id="args-removed"),
    pytest.param({"numNodes": 1, "env": [{"name": "A", "value": "1"}]}, {"numNodes": 1, "env": [{"name": "A", "value": "1"}]},
                 [], id="unchanged"),
])
def test_trainer_is_immutable_but_for_num_nodes(old_trainer: dict, new_trainer: dict, texts: list[str]) -> None:
    old = trainjob(trainer=old_trainer)
    result = validate_trainjob(trainjob(trainer=new_trainer), old, runtime=node_runtime({"torch": {}}))
    assert result.texts() == texts
    assert result.code == (422 if texts else 200)


def test_num_nodes_changes_only_with_an_elastic_runtime() -> None:
    old, new = trainjob(trainer={"numNodes": 1}), trainjob(trainer={"numNodes": 3})
    plain = validate_trainjob(new, old, runtime=node_runtime({"torch": {}}))
    assert (plain.code, plain.texts()) == (403, ['spec.trainer: Invalid value: {"numNodes":3}: field is immutable'])
    assert plain.kubectl_message("TrainJob", "test-job") == 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: ' \
        'spec.trainer: Invalid value: {"numNodes":3}: field is immutable'
    elastic = validate_trainjob(new, old, runtime=node_runtime({"torch": {"elasticPolicy": {"maxNodes": 4}}}))
    assert elastic.allowed


@pytest.mark.parametrize("old_spec, new_spec, text", [
    pytest.param({"initializer": {"model": {"storageUri": "hf://a"}}}, {"initializer": {"model": {"storageUri": "hf://b"}}},
                 'spec.initializer: Invalid value: "object": field is immutable', id="initializer"),
    pytest.param({"activeDeadlineSeconds": 60}, {"activeDeadlineSeconds": 120},
                 'spec.activeDeadlineSeconds: Invalid value: "integer": field is immutable', id="deadline"),
    pytest.param({"runtimePatches": [patch(pod_spec={"serviceAccountName": "a"})]},
                 {"runtimePatches": [patch(pod_spec={"serviceAccountName": "b"})], "suspend": True},
                 'spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template'
                 '.spec.serviceAccountName: Invalid value: "string": field is immutable', id="patch-service-account"),
])
def test_v23_immutable_fields(old_spec: dict, new_spec: dict, text: str) -> None:
    old = with_spec(trainjob(), **old_spec)
    new = with_spec(trainjob(), **new_spec)
    result = validate_trainjob(new, old, runtime=node_runtime())
    assert (result.code, result.texts()) == (422, [text])


@pytest.mark.parametrize("spec, text", [
    pytest.param({"activeDeadlineSeconds": 0},
                 "spec.activeDeadlineSeconds: Invalid value: 0: spec.activeDeadlineSeconds in body should be greater "
                 "than or equal to 1", id="deadline-zero"),
    pytest.param({"initializer": {"dataset": {"storageUri": "bucket/path"}}},
                 'spec.initializer.dataset.storageUri: Invalid value: "string": storageUri may be empty, or it must be '
                 "a valid URI (scheme://...)", id="storage-uri"),
])
def test_v23_create_rules(spec: dict, text: str) -> None:
    result = validate_trainjob(with_spec(trainjob(), **spec), runtime=node_runtime())
    assert (result.code, result.texts()) == (422, [text])


@pytest.mark.parametrize("ml_policy, text", [
    pytest.param({"jax": {}, "torch": {}}, 'spec.mlPolicy: Invalid value: "object": Only one of the policy can be configured',
                 id="jax-and-torch"),
    pytest.param({"xgboost": {}, "mpi": {}}, 'spec.mlPolicy: Invalid value: "object": Only one of the policy can be configured',
                 id="xgboost-and-mpi"),
    pytest.param({"flux": {"numProcPerNode": 0}},
                 'spec.mlPolicy.flux.numProcPerNode: Invalid value: "integer": NumProcPerNode in fluxPolicy must be >= 1',
                 id="flux-nproc"),
    pytest.param({"torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["node"]}]}}},
                 'spec.mlPolicy.torch.envInjection.targets[0].containerNames: Invalid value: "array": containerNames '
                 "must not include the main node container because PET_* envs are always injected into it",
                 id="env-injection-node"),
])
def test_v23_runtime_rules(ml_policy: dict, text: str) -> None:
    result = validate_runtime(node_runtime(ml_policy))
    assert (result.code, result.texts()) == (422, [text])


def test_v23_runtimes_with_one_new_policy_are_admitted() -> None:
    for ml_policy in ({"jax": {}}, {"xgboost": {}}, {"flux": {"numProcPerNode": 2}}):
        assert validate_runtime(node_runtime(ml_policy)).allowed


# --- runtimePatches: webhook ----------------------------------------------------------------

@pytest.mark.parametrize("patches, texts", [
    pytest.param([patch(manager="kueue")], ['spec.runtimePatches.manager: Invalid value: "kueue": '
                                            'must be a domain-prefixed path (such as "acme.io/foo")'], id="manager"),
    pytest.param([patch(job_name="worker")], ["must not have replicated job that doesn't exist in the runtime job template"],
                 id="unknown-job"),
    pytest.param([patch(pod_spec={"containers": [{"name": "sidecar"}]})],
                 ["must not have container that doesn't exist in the runtime job node"], id="unknown-container"),
    pytest.param([patch(pod_spec={"initContainers": [{"name": "warmup"}]})],
                 ["must not have initContainer that doesn't exist in the runtime job node"], id="unknown-init"),
    pytest.param([patch(pod_spec={"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}]})],
                 ["must not have envs for the dataset-initializer, model-initializer, node containers"], id="node-env"),
    pytest.param([patch(pod_spec={"nodeSelector": {"a": "b"}})], [], id="valid"),
])
def test_runtime_patch_admission(patches: list, texts: list[str]) -> None:
    result = validate_trainjob(with_spec(trainjob(), runtimePatches=patches), runtime=node_runtime())
    found = result.texts()
    assert len(found) == len(texts)
    for text, expected in zip(found, texts):
        assert text.startswith("spec.runtimePatches") and text.endswith(expected)


def test_runtime_patches_change_only_while_suspended_before_or_after() -> None:
    old = with_spec(trainjob(), runtimePatches=[patch(pod_spec={"nodeSelector": {"a": "1"}})])
    new = with_spec(trainjob(), runtimePatches=[patch(pod_spec={"nodeSelector": {"a": "2"}})])
    running = validate_trainjob(new, old, runtime=node_runtime())
    assert running.texts() == ["spec.runtimePatches: Forbidden: RuntimePatches can only be modified when the "
                               "TrainJob is suspended before or after the update"]
    # Kueue writes the patch and lifts suspend in one request.
    suspended_before = validate_trainjob(new, with_spec(old, suspend=True), runtime=node_runtime())
    assert suspended_before.allowed
    active = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "test-job", "namespace": "default"},
              "status": {"replicatedJobsStatus": [{"name": "node", "active": 1}]}}
    blocked = validate_trainjob(with_spec(new, suspend=True), old, runtime=node_runtime(), observed=[active])
    assert blocked.texts() == ["spec.runtimePatches: Forbidden: RuntimePatches cannot be modified when the "
                               "JobSet's ReplicatedJob node is still active"]


# --- runtimePatches: planning ---------------------------------------------------------------

def test_patches_apply_after_pod_template_overrides_in_list_order() -> None:
    job_doc = with_spec(trainjob(), podTemplateOverrides=[
        {"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": {"pool": "overrides", "zone": "a"}}}],
        runtimePatches=[patch(pod_spec={"nodeSelector": {"pool": "first"}}, labels={"q": "1"}),
                        patch(manager="example.com/b", pod_spec={"nodeSelector": {"pool": "second"}},
                              labels={"q": "2"})])
    jobset = find(plan(job_doc, node_runtime()).objects, "JobSet")
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "second", "zone": "a"}
    assert jobset["metadata"]["labels"] == {"q": "2"}


def test_patches_merge_containers_by_name_and_keep_the_runtime_job_order() -> None:
    rt = runtime([job("init", container("init")), job("node", container("node"), container("sidecar"), ancestor="trainer")])
    job_doc = with_spec(trainjob(), runtimePatches=[patch(pod_spec={"containers": [
        {"name": "sidecar", "env": [{"name": "MODE", "value": "patched"}],
         "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "emptyDir": {}}]})])
    jobset = find(plan(job_doc, rt).objects, "JobSet")
    assert [j["name"] for j in jobset["spec"]["replicatedJobs"]] == ["init", "node"]
    pod = jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
    assert env_of(sidecar) == {"MODE": "patched"}
    assert sidecar["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert pod["volumes"] == [{"name": "data", "emptyDir": {}}]


# --- torch envInjection -----------------------------------------------------------------------

def test_env_injection_gives_targets_the_pet_variables_and_the_master_address() -> None:
    policy = {"torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["sidecar", "preflight"]}]}}}
    rt = node_runtime(policy, container("sidecar"), init=[container("preflight")])
    jobset = find(plan(trainjob(trainer={"numNodes": 2}), rt).objects, "JobSet")
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
    preflight = pod["initContainers"][0]
    for target in (sidecar, preflight):
        assert [e["name"] for e in target["env"]] == ["PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK",
                                                      "PET_MASTER_ADDR", "PET_MASTER_PORT"]
        assert env_of(target)["PET_MASTER_ADDR"] == "test-job-node-0-0.test-job"
        assert "ports" not in target


def test_env_injection_target_missing_from_the_runtime() -> None:
    policy = {"torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["ghost"]}]}}}
    result = validate_trainjob(trainjob(), runtime=node_runtime(policy))
    assert result.texts() == ['spec.runtimeRef: Invalid value: {"jobName":"node","containerNames":["ghost"]}: '
                              'envInjection target podSet "node" container "ghost" not found in runtime template']
    with pytest.raises(PlanningError, match='envInjection target podSet "node" container "ghost" not found'):
        plan(trainjob(), node_runtime(policy))


# --- JAX and XGBoost --------------------------------------------------------------------------

def test_jax_sets_process_count_id_and_coordinator() -> None:
    jobset = find(plan(trainjob(trainer={"numNodes": 4}), node_runtime({"jax": {}})).objects, "JobSet")
    node = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    env = env_of(node)
    assert env["JAX_NUM_PROCESSES"] == "4"
    assert env["JAX_COORDINATOR_ADDRESS"] == "test-job-node-0-0.test-job:29500"
    assert node["ports"] == [{"containerPort": 29500}]
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 4


@pytest.mark.parametrize("resources, workers", [
    pytest.param(None, "2", id="cpu-one-per-node"),
    pytest.param({"limits": {"nvidia.com/gpu": 4}}, "8", id="one-per-gpu"),
])
def test_xgboost_workers(resources: dict | None, workers: str) -> None:
    trainer: dict[str, Any] = {"numNodes": 2}
    if resources:
        trainer["resourcesPerNode"] = resources
    jobset = find(plan(trainjob(trainer=trainer), node_runtime({"xgboost": {}})).objects, "JobSet")
    env = env_of(jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0])
    assert (env["DMLC_NUM_WORKER"], env["DMLC_TRACKER_URI"], env["DMLC_TRACKER_PORT"]) == \
        (workers, "test-job-node-0-0.test-job", "29500")


def test_xgboost_reserved_envs_are_forbidden() -> None:
    job_doc = trainjob(trainer={"env": [{"name": "OK", "value": "1"}, {"name": "DMLC_NUM_WORKER", "value": "9"}]})
    result = validate_trainjob(job_doc, runtime=node_runtime({"xgboost": {}}))
    assert result.texts() == ["spec.trainer.env[1]: Forbidden: DMLC_NUM_WORKER is reserved for the XGBoost runtime"]


def test_torch_runtime_unaffected_by_new_sources() -> None:
    jobset = find(plan(trainjob(trainer={"numNodes": 2}), torch_runtime()).objects, "JobSet")
    assert jobset is not None


def test_flux_admission_rules() -> None:
    # Planning: tests/unit/pipeline/test_flux.py.
    rt = node_runtime({"flux": {"numProcPerNode": 1}}, init=[container("flux-installer")])
    result = validate_trainjob(trainjob(trainer={"numProcPerNode": 0}), runtime=rt)
    assert result.texts() == [
        "spec.trainer.numProcPerNode: Invalid value: 0: must be greater than or equal to 1 for Flux TrainJob",
        'spec.trainer.initContainers: Invalid value: "flux-installer": InitContainer \'flux-installer\' is reserved']


def test_mpi_reserved_envs_are_refused() -> None:
    rt = runtime([job("node", container("node"))], ml_policy={"mpi": {}})
    result = validate_trainjob(trainjob(trainer={"env": [{"name": "OMPI_MCA_plm_rsh_args", "value": "x"},
                                                         {"name": "OMPI_MCA_orte_default_hostfile", "value": "y"}]}),
                               runtime=rt)
    assert result.texts() == [
        'spec.trainer.env: Invalid value: [{"name":"OMPI_MCA_plm_rsh_args","value":"x"},'
        '{"name":"OMPI_MCA_orte_default_hostfile","value":"y"}]: must not have reserved envs, invalid envs '
        "configured: [OMPI_MCA_orte_default_hostfile OMPI_MCA_plm_rsh_args]"]


@pytest.mark.parametrize("trainer, texts", [
    pytest.param({"command": ["tune", "run"], "numNodes": 2, "args": ["model.lora_attn_modules=[q_proj]"]},
                 ["spec.trainer.numNodes: Invalid value: 2: LoRA fine-tuning is not supported for multi-node "
                  "training in TorchTune"], id="lora-multi-node"),
    pytest.param({"command": ["tune", "run"], "args": ["batch_size=2", "output_dir=/tmp/x"]},
                 ['spec.trainer.args[1]: Invalid value: "output_dir=/tmp/x": must not set immutable config '
                  '"output_dir" in trainer args; it is managed by the runtime'], id="immutable-config"),
    pytest.param({"command": ["tune", "run"], "args": ["batch_size=2"]}, [], id="valid-without-numProcPerNode"),
])
def test_torchtune_v23_rules(trainer: dict, texts: list[str]) -> None:
    rt = runtime([job("node", container("node"), ancestor="trainer")], ml_policy={"torch": {}},
                 name="torchtune-llama3.3-70b", kind="ClusterTrainingRuntime")
    job_doc = trainjob(trainer=trainer, runtime_name="torchtune-llama3.3-70b", runtime_kind="ClusterTrainingRuntime")
    assert validate_trainjob(job_doc, runtime=rt).texts() == texts


def test_endpoints_cover_every_replica_of_a_job() -> None:
    # v2.3.0: <trainjob>-<job>-<replica>-<pod>.<subdomain> for every replica (v2.1.0: replica 0).
    rt = runtime([job("launcher", container("node"), ancestor="trainer"),
                  job("node", container("node"), replicas=2)], ml_policy={"numNodes": 2, "mpi": {}})
    objects = plan(trainjob(trainer={"numNodes": 2}), rt, new_ssh_key=lambda: (b"k", b"p")).objects
    hostfile = find(objects, "ConfigMap")["data"]["hostfile"]
    assert hostfile.splitlines() == ["test-job-node-0-0.test-job slots=1", "test-job-node-0-1.test-job slots=1",
                                     "test-job-node-1-0.test-job slots=1", "test-job-node-1-1.test-job slots=1"]
