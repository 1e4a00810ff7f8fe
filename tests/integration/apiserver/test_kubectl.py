"""The real kubectl binary against a real devcluster: the issue's kubectl list, one server per module."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from fixtures.devcluster import api_workers_args, start_devcluster
from integration.apiserver._manifests import RUNTIME, install_trainer_crds, trainjob


@pytest.fixture(scope="module")
def cluster(api_workers, tmp_path_factory):
    """One devcluster per worker count: the single process, and 4 API workers over one store
    process (every kubectl call is a new connection, so the kernel spreads them over the workers)."""
    devcluster = start_devcluster(tmp_path_factory.mktemp("devcluster") / "data", api_workers_args(api_workers))
    try:
        install_trainer_crds(devcluster)
        devcluster.kubectl("apply", "-f", "-", input=RUNTIME)
        yield devcluster
    finally:
        devcluster.stop()


def test_default_namespaces_version_and_api_resources(cluster):
    names = cluster.kubectl("get", "ns", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system", "namespace/kubeflow-system"} <= set(names)
    assert json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"].startswith("v1.36.")
    resources = cluster.kubectl("api-resources", "-o", "name").stdout.split()
    assert {"pods", "jobs.batch", "customresourcedefinitions.apiextensions.k8s.io", "leases.coordination.k8s.io",
            "validatingwebhookconfigurations.admissionregistration.k8s.io", "events.events.k8s.io"} <= set(resources)


def test_auth_can_i_and_whoami_answer_for_the_single_admin_user(cluster):
    assert cluster.kubectl("auth", "can-i", "create", "trainjobs").stdout.strip() == "yes"
    assert "devcluster-admin" in cluster.kubectl("auth", "whoami").stdout


def test_installed_crds_are_served_in_discovery_and_explain(cluster):
    resources = cluster.kubectl("api-resources", "--api-group=trainer.kubeflow.org", "-o", "name").stdout.split()
    assert set(resources) == {"clustertrainingruntimes.trainer.kubeflow.org", "trainingruntimes.trainer.kubeflow.org",
                              "trainjobs.trainer.kubeflow.org"}
    explained = cluster.kubectl("explain", "trainjob.spec.trainer").stdout
    assert "numNodes" in explained and "KIND:       TrainJob" in explained


def test_client_side_apply_creates_configures_and_is_idempotent(cluster):
    assert "created" in cluster.kubectl("apply", "-f", "-", input=trainjob("csa", 2)).stdout
    first = json.loads(cluster.kubectl("get", "trainjob", "csa", "-o", "json").stdout)
    assert first["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"  # CRD default applied
    assert "configured" in cluster.kubectl("apply", "-f", "-", input=trainjob("csa", 3)).stdout
    second = json.loads(cluster.kubectl("get", "trainjob", "csa", "-o", "json").stdout)
    assert second["spec"]["trainer"]["numNodes"] == 3
    assert second["metadata"]["generation"] == 2
    assert "unchanged" in cluster.kubectl("apply", "-f", "-", input=trainjob("csa", 3)).stdout
    third = json.loads(cluster.kubectl("get", "trainjob", "csa", "-o", "json").stdout)
    assert third["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"]


def test_get_output_formats(cluster):
    cluster.kubectl("create", "-f", "-", input=trainjob("formats", 1))
    doc = yaml.safe_load(cluster.kubectl("get", "trainjob", "formats", "-o", "yaml").stdout)
    assert doc["metadata"]["namespace"] == "default" and doc["metadata"]["uid"]
    assert doc["metadata"]["creationTimestamp"].endswith("Z")
    wide = cluster.kubectl("get", "trainjobs", "-o", "wide").stdout
    assert wide.splitlines()[0].split()[:2] == ["NAME", "STATE"]
    listed = json.loads(cluster.kubectl("get", "trainjobs", "-A", "-o", "json").stdout)
    assert listed["kind"] == "List" and all(i["kind"] == "TrainJob" for i in listed["items"])


def test_create_twice_is_already_exists(cluster):
    cluster.kubectl("create", "-f", "-", input=trainjob("dup", 1))
    result = cluster.kubectl("create", "-f", "-", input=trainjob("dup", 1), check=False)
    assert result.returncode != 0
    assert 'Error from server (AlreadyExists)' in result.stderr and '"dup" already exists' in result.stderr


def test_patch_merge_json_and_strategic_rules(cluster):
    cluster.kubectl("create", "-f", "-", input=trainjob("patched", 1))
    cluster.kubectl("patch", "trainjob", "patched", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    cluster.kubectl("patch", "trainjob", "patched", "--type=json", "-p",
                    '[{"op":"replace","path":"/spec/trainer/numNodes","value":4}]')
    obj = json.loads(cluster.kubectl("get", "trainjob", "patched", "-o", "json").stdout)
    assert obj["spec"]["suspend"] is True and obj["spec"]["trainer"]["numNodes"] == 4
    refused = cluster.kubectl("patch", "trainjob", "patched", "-p", '{"spec":{"suspend":false}}', check=False)
    assert refused.returncode != 0 and "application/strategic-merge-patch+json is not supported" in refused.stderr
    failed_test = cluster.kubectl("patch", "trainjob", "patched", "--type=json", "-p",
                                  '[{"op":"test","path":"/spec/suspend","value":false}]', check=False)
    assert failed_test.returncode != 0


def test_strategic_merge_patch_on_a_pod_merges_containers_by_name(cluster):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "smp", "labels": {"a": "b"}},
           "spec": {"containers": [{"name": "node", "image": "busybox", "env": [{"name": "A", "value": "1"}]},
                                   {"name": "side", "image": "busybox"}]}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    cluster.kubectl("patch", "pod", "smp", "-p",
                    '{"spec":{"containers":[{"name":"node","env":[{"name":"B","value":"2"}]}]}}')
    obj = json.loads(cluster.kubectl("get", "pod", "smp", "-o", "json").stdout)
    containers = {c["name"]: c for c in obj["spec"]["containers"]}
    assert set(containers) == {"node", "side"}
    assert {e["name"] for e in containers["node"]["env"]} == {"A", "B"}


def test_label_selectors_equality_and_set_based(cluster):
    for name, labels in (("sel-1", {"a": "b", "c": "x"}), ("sel-2", {"a": "b", "c": "z"}), ("sel-3", {"a": "q", "c": "y"})):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
               "spec": {"containers": [{"name": "node", "image": "busybox"}]}}
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    names = cluster.kubectl("get", "pods", "-l", "a=b,c in (x,y)", "-o", "name").stdout.split()
    assert names == ["pod/sel-1"]
    names = cluster.kubectl("get", "pods", "-l", "c notin (x),a", "-o", "name").stdout.split()
    assert "pod/sel-2" in names and "pod/sel-3" in names and "pod/sel-1" not in names
    bad = cluster.kubectl("get", "pods", "-l", "a in (", check=False)
    assert bad.returncode != 0


def test_status_subresource_and_wait_for_condition(cluster):
    cluster.kubectl("create", "-f", "-", input=trainjob("waited", 1))
    waiter = subprocess.Popen(
        [str(cluster_kubectl(cluster)), f"--cache-dir={cluster.cache_dir}", "wait", "--for=condition=Complete",
         "trainjob/waited", "--timeout=30s"], env=cluster_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        status = {"status": {"conditions": [{"type": "Complete", "status": "True", "reason": "JobSetCompleted",
                                             "message": "done", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
        cluster.kubectl("patch", "trainjob", "waited", "--type=merge", "--subresource=status", "-p", json.dumps(status))
        out, err = waiter.communicate(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, err
    assert "condition met" in out
    obj = json.loads(cluster.kubectl("get", "trainjob", "waited", "-o", "json").stdout)
    assert obj["metadata"]["generation"] == 1  # status writes never bump generation
    # a status write through the main resource is ignored
    cluster.kubectl("patch", "trainjob", "waited", "--type=merge", "-p", '{"status":{"conditions":[]}}')
    again = json.loads(cluster.kubectl("get", "trainjob", "waited", "-o", "json").stdout)
    assert again["status"]["conditions"][0]["type"] == "Complete"
    table = cluster.kubectl("get", "trainjob", "waited").stdout
    assert "Complete" in table.splitlines()[1]


def cluster_kubectl(cluster):
    from fixtures.devcluster import KUBECTL
    return KUBECTL


def cluster_env(cluster):
    import os
    return dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))


def test_delete_waits_for_finalizer_removal(cluster):
    cluster.kubectl("create", "-f", "-", input=trainjob("held", 1))
    cluster.kubectl("patch", "trainjob", "held", "--type=merge", "-p", '{"metadata":{"finalizers":["example.com/hold"]}}')
    deleter = subprocess.Popen([str(cluster_kubectl(cluster)), f"--cache-dir={cluster.cache_dir}", "delete", "trainjob",
                                "held", "--timeout=30s"], env=cluster_env(cluster), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            obj = json.loads(cluster.kubectl("get", "trainjob", "held", "-o", "json").stdout)
            if obj["metadata"].get("deletionTimestamp") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert obj["metadata"]["deletionTimestamp"]
        assert deleter.poll() is None  # still waiting on the finalizer
        cluster.kubectl("patch", "trainjob", "held", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        deleter.communicate(timeout=30)
    finally:
        if deleter.poll() is None:
            deleter.kill()
            deleter.wait()
    assert deleter.returncode == 0
    gone = cluster.kubectl("get", "trainjob", "held", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_get_watch_sees_changes(cluster):
    cluster.kubectl("create", "-f", "-", input=trainjob("watched", 1))
    watcher = subprocess.Popen([str(cluster_kubectl(cluster)), f"--cache-dir={cluster.cache_dir}", "get", "trainjobs",
                                "-w", "--field-selector=metadata.name=watched", "-o", "name"],
                               env=cluster_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        cluster.kubectl("label", "trainjob", "watched", "changed=yes")
        cluster.kubectl("delete", "trainjob", "watched")
        time.sleep(1.0)
    finally:
        watcher.terminate()
        out, _ = watcher.communicate(timeout=10)
    assert out.count("trainjob.trainer.kubeflow.org/watched") >= 3


def test_describe_shows_events(cluster):
    cluster.kubectl("create", "-f", "-", input=trainjob("described", 1))
    uid = json.loads(cluster.kubectl("get", "trainjob", "described", "-o", "json").stdout)["metadata"]["uid"]
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "described.1"},
             "involvedObject": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "described",
                                "namespace": "default", "uid": uid},
             "reason": "Created", "message": "JobSet described created", "type": "Normal",
             "source": {"component": "trainer"}, "firstTimestamp": "2026-01-01T00:00:00Z",
             "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1}
    cluster.kubectl("create", "-f", "-", input=json.dumps(event))
    described = cluster.kubectl("describe", "trainjob", "described").stdout
    assert "JobSet described created" in described
    # the same Event through events.k8s.io/v1 (one storage, converted fields)
    newer = json.loads(cluster.kubectl("get", "events.v1.events.k8s.io", "described.1", "-o", "json").stdout)
    assert newer["note"] == "JobSet described created" and newer["regarding"]["name"] == "described"
    cluster.kubectl("patch", "events.v1.events.k8s.io", "described.1", "--type=merge", "-p", '{"note":"changed"}')
    assert cluster.kubectl("get", "ev", "described.1", "-o", "jsonpath={.message}").stdout == "changed"


def test_logs_follow_streams_until_the_container_terminates(cluster):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "logger"},
           "spec": {"containers": [{"name": "node", "image": "busybox"}, {"name": "side", "image": "busybox"}]}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    status = {"status": {"phase": "Running", "containerStatuses": [
        {"name": "node", "ready": True, "restartCount": 0, "image": "busybox", "imageID": "", "state": {"running": {}}}]}}
    cluster.kubectl("patch", "pod", "logger", "--subresource=status", "--type=merge", "-p", json.dumps(status))
    log_file = cluster.data_dir / "pods" / "default" / "logger" / "node.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text("line 1\nline 2\n")
    assert cluster.kubectl("logs", "logger", "-c", "node", "--tail=1").stdout == "line 2\n"
    follower = subprocess.Popen([str(cluster_kubectl(cluster)), f"--cache-dir={cluster.cache_dir}", "logs", "-f",
                                 "logger", "-c", "node"], env=cluster_env(cluster), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.8)
        with log_file.open("a") as handle:
            handle.write("line 3\n")
        time.sleep(0.5)
        assert follower.poll() is None  # still following
        done = {"status": {"phase": "Succeeded", "containerStatuses": [
            {"name": "node", "ready": False, "restartCount": 0, "image": "busybox", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}}
        cluster.kubectl("patch", "pod", "logger", "--subresource=status", "--type=merge", "-p", json.dumps(done))
        out, err = follower.communicate(timeout=15)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert out == "line 1\nline 2\nline 3\n", err
    missing = cluster.kubectl("logs", "logger", "-c", "nope", check=False)
    assert missing.returncode != 0 and "container nope is not valid for pod logger" in missing.stderr


def test_owner_reference_garbage_collection_background_and_foreground(cluster):
    cluster.kubectl("create", "-f", "-", input=trainjob("owner-bg", 1))
    cluster.kubectl("create", "-f", "-", input=trainjob("owner-fg", 1))
    for owner in ("owner-bg", "owner-fg"):
        uid = json.loads(cluster.kubectl("get", "trainjob", owner, "-o", "json").stdout)["metadata"]["uid"]
        ref = [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": owner, "uid": uid,
                "controller": True, "blockOwnerDeletion": True}]
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{owner}-cm", "ownerReferences": ref}}
        cluster.kubectl("create", "-f", "-", input=json.dumps(cm))
        cm_uid = json.loads(cluster.kubectl("get", "cm", f"{owner}-cm", "-o", "json").stdout)["metadata"]["uid"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{owner}-pod", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": f"{owner}-cm", "uid": cm_uid}]},
               "spec": {"containers": [{"name": "node", "image": "busybox"}]}}
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    cluster.kubectl("delete", "trainjob", "owner-bg")
    cluster.kubectl("delete", "trainjob", "owner-fg", "--cascade=foreground")
    left = cluster.kubectl("get", "cm,pods", "-o", "name").stdout.split()
    assert not [n for n in left if "owner-" in n]
    assert cluster.kubectl("get", "trainjob", "owner-fg", check=False).returncode != 0


def test_namespace_deletion_removes_its_contents(cluster):
    cluster.kubectl("create", "namespace", "doomed")
    status = json.loads(cluster.kubectl("get", "--raw", "/api/v1/namespaces/doomed/status").stdout)
    assert status["kind"] == "Namespace" and status["status"]["phase"] == "Active"
    cluster.kubectl("create", "-n", "doomed", "-f", "-", input=trainjob("inside", 1))
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "inside", "namespace": "doomed"}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(cm))
    cluster.kubectl("delete", "namespace", "doomed", "--timeout=30s")
    assert cluster.kubectl("get", "ns", "doomed", check=False).returncode != 0
    assert "inside" not in cluster.kubectl("get", "trainjobs,cm", "-A", "-o", "name").stdout


def test_generator_commands_send_protobuf_bodies(cluster):
    cluster.kubectl("create", "configmap", "proto-cm", "--from-literal=a=b")
    cluster.kubectl("create", "secret", "generic", "proto-secret", "--from-literal=p=q")
    cluster.kubectl("create", "serviceaccount", "proto-sa")
    cluster.kubectl("create", "job", "proto-job", "--image=busybox", "--", "echo", "hi")
    cluster.kubectl("run", "proto-pod", "--image=busybox", "--labels=app=proto", "--", "sleep", "1")
    assert json.loads(cluster.kubectl("get", "cm", "proto-cm", "-o", "json").stdout)["data"] == {"a": "b"}
    job = json.loads(cluster.kubectl("get", "job", "proto-job", "-o", "json").stdout)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["echo", "hi"]
    assert json.loads(cluster.kubectl("get", "pod", "proto-pod", "-o", "json").stdout)["metadata"]["labels"] == {"app": "proto"}


def test_server_side_apply_with_kubectl_conflict_and_force(cluster):
    cluster.kubectl("apply", "--server-side", "-f", "-", input=trainjob("ssa-kubectl", 2))
    cluster.kubectl("patch", "trainjob", "ssa-kubectl", "--type=merge", "-p", '{"spec":{"trainer":{"numNodes":5}}}')
    conflict = cluster.kubectl("apply", "--server-side", "-f", "-", input=trainjob("ssa-kubectl", 3), check=False)
    assert conflict.returncode != 0
    assert 'conflict with "kubectl-patch"' in conflict.stderr and ".spec.trainer.numNodes" in conflict.stderr
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=trainjob("ssa-kubectl", 3))
    obj = json.loads(cluster.kubectl("get", "trainjob", "ssa-kubectl", "-o", "json").stdout)
    assert obj["spec"]["trainer"]["numNodes"] == 3


WIDGET_CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: ["wdg"]}
  versions:
    - name: v1
      served: true
      storage: true
      additionalPrinterColumns:
        - {name: Size, type: integer, jsonPath: .spec.size}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer, minimum: 1, default: 3}
"""


def test_crd_install_serves_at_once_and_removal_deletes_its_objects(cluster):
    cluster.kubectl("create", "-f", "-", input=WIDGET_CRD)
    cluster.kubectl("create", "-f", "-", input="apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {}\n")
    table = cluster.kubectl("get", "wdg").stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE"] and table[1].split() == ["w1", "3"]  # declared columns only
    invalid = cluster.kubectl("create", "-f", "-", input="apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2}\nspec: {size: 0}\n",
                              check=False)
    assert invalid.returncode != 0 and "spec.size" in invalid.stderr
    cluster.kubectl("delete", "crd", "widgets.example.com")
    assert "widgets" not in cluster.kubectl("api-resources", "-o", "name").stdout
    gone = cluster.kubectl("get", "--raw", "/apis/example.com/v1/namespaces/default/widgets/w1", check=False)
    assert gone.returncode != 0
