"""The sync ``kubernetes`` client and the Kubeflow SDK (``TrainerClient``) against a real devcluster.

No control plane runs here: the test plays the controllers' part (pods, statuses, log files,
events) through the API, and checks every SDK call of the SDK contract end to end.
"""
from __future__ import annotations

import threading
import time

import pytest
import yaml
from kubernetes import client, config

from integration.apiserver._manifests import RUNTIME, install_trainer_crds

NS = "default"
NODE_SELECTOR = ("jobset.sigs.k8s.io/jobset-name={job},jobset.sigs.k8s.io/replicatedjob-name in "
                 "(dataset-initializer, model-initializer, launcher, node)")


@pytest.fixture(scope="module")
def cluster(devcluster_module):
    install_trainer_crds(devcluster_module)
    devcluster_module.kubectl("apply", "-f", "-", input=RUNTIME)
    return devcluster_module


@pytest.fixture(scope="module")
def core(cluster):
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    api_client.close()


def make_pod(core_api, job: str, index: int, uid: str) -> str:
    name = f"{job}-node-0-{index}"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"jobset.sigs.k8s.io/jobset-name": job,
                                                 "jobset.sigs.k8s.io/replicatedjob-name": "node",
                                                 "batch.kubernetes.io/job-completion-index": str(index)},
                        "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                             "name": job, "uid": uid, "controller": True}]},
           "spec": {"containers": [{"name": "node", "image": "pytorch", "resources": {"limits": {"cpu": "2"}}}]}}
    core_api.create_namespaced_pod(NS, pod)
    return name


def set_phase(core_api, name: str, phase: str, terminated: bool = False) -> None:
    state = {"terminated": {"exitCode": 0, "reason": "Completed"}} if terminated else {"running": {}}
    core_api.patch_namespaced_pod_status(name, NS, [{"op": "replace", "path": "/status", "value": {
        "phase": phase, "containerStatuses": [{"name": "node", "ready": not terminated, "restartCount": 0,
                                               "image": "pytorch", "imageID": "", "state": state}]}}])


def test_sync_client_calls_of_the_sdk_contract(cluster, core):
    core_api, crs = core
    core_api.create_namespaced_config_map("kubeflow-system", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kubeflow-trainer-public"},
        "data": {"kubeflow_trainer_version": "2.1.0"}})
    cm = core_api.read_namespaced_config_map("kubeflow-trainer-public", "kubeflow-system")
    assert cm.data["kubeflow_trainer_version"] == "2.1.0"
    runtimes = crs.list_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")
    assert [r["kind"] for r in runtimes["items"]] == ["ClusterTrainingRuntime"]
    with pytest.raises(client.ApiException) as caught:
        crs.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainingruntimes", "torch-distributed")
    assert caught.value.status == 404
    events = core_api.list_namespaced_event(NS)
    assert events.items == [] or all(e.involved_object for e in events.items)


def test_kubeflow_sdk_flow_against_the_devcluster(cluster, core):
    from kubeflow.trainer import CustomTrainer, KubernetesBackendConfig, TrainerClient

    core_api, crs = core
    trainer = TrainerClient(KubernetesBackendConfig(config_file=str(cluster.kubeconfig), namespace=NS))
    assert "torch-distributed" in [r.name for r in trainer.list_runtimes()]

    def train_fn():
        print("hello")

    job = trainer.train(trainer=CustomTrainer(func=train_fn, num_nodes=2, resources_per_node={"cpu": 2}))
    stored = crs.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", job)
    uid = stored["metadata"]["uid"]
    assert stored["spec"]["trainer"]["resourcesPerNode"]["limits"]["cpu"] == 2  # 2.0 decoded as an integer
    pods = [make_pod(core_api, job, i, uid) for i in range(2)]
    for pod in pods:
        set_phase(core_api, pod, "Running")
    log_file = cluster.data_dir / "pods" / NS / pods[0] / "node.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text("epoch 1\n")
    steps = {s.name: s for s in trainer.get_job(job).steps}
    assert set(steps) == {"node-0", "node-1"} and steps["node-0"].status == "Running"
    assert trainer.get_job(job).status == "Running"

    def finish() -> None:
        time.sleep(0.6)
        with log_file.open("a") as handle:
            handle.write("epoch 2\n")
        time.sleep(0.4)
        for pod in pods:
            set_phase(core_api, pod, "Succeeded", terminated=True)
    finisher = threading.Thread(target=finish)
    finisher.start()
    lines = list(trainer.get_job_logs(job, follow=True))  # ends when the container terminates
    finisher.join()
    assert lines == ["epoch 1", "epoch 2"]

    core_api.create_namespaced_event(NS, {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{job}.created"},
        "involvedObject": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": job,
                           "namespace": NS, "uid": uid},
        "reason": "Created", "message": "created", "type": "Normal", "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1, "source": {"component": "trainer"}})
    assert [e.message for e in trainer.get_job_events(job)] == ["created"]
    crs.patch_namespaced_custom_object_status("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", job, {
        "status": {"conditions": [{"type": "Complete", "status": "True", "reason": "JobSetCompleted", "message": "",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    assert trainer.wait_for_job_status(job, timeout=10, polling_interval=1).status == "Complete"
    assert job in [j.name for j in trainer.list_jobs()]
    trainer.delete_job(job)
    # no propagationPolicy was sent: garbage collection removes the pods the TrainJob owned
    remaining = core_api.list_namespaced_pod(NS, label_selector=NODE_SELECTOR.format(job=job)).items
    assert remaining == []


def test_dynamic_client_server_side_apply(cluster):
    from kubernetes.dynamic import DynamicClient

    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        dyn = DynamicClient(api_client)
        cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
        body = yaml.safe_load("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: dyn-ssa, namespace: default}\ndata: {a: '1'}")
        created = dyn.server_side_apply(cms, body=body, field_manager="dyn-test")
        assert created.data.a == "1"
        assert created.metadata.managedFields[0].manager == "dyn-test"
    finally:
        api_client.close()
