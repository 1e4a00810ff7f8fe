"""JobSet's ElasticJobSet feature gate in the devcluster data plane, with real pods: a running
JobSet resized with kubectl (survivors keep their pods, scale-down removes the highest index,
scale-up adds the new index) when `devcluster up --jobset-feature-gates ElasticJobSet=true`;
refused with a message naming the gate when it is off (the default)."""
from __future__ import annotations

import json

import pytest
import yaml

from fixtures.dataplane import REPO, jobset_object, replicated_job, wait_until
from fixtures.devcluster import start_devcluster
from trainyard.kube.resources import JOBSET, Resource

POD = Resource("", "v1", "pods", "Pod")
JOB = Resource("batch", "v1", "jobs", "Job")
CRD = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                    "ValidatingWebhookConfiguration", False)
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture(scope="module")
def elastic_cluster(tmp_path_factory):
    """`trainyard devcluster up` with its embedded data plane and the gate on (as `trainyard up`)."""
    cluster = start_devcluster(tmp_path_factory.mktemp("elastic") / "data",
                               ["--dataplane", "--jobset-feature-gates", "ElasticJobSet=true"])
    try:
        doc = yaml.safe_load((REPO / "deploy" / "crds" / "jobset.x-k8s.io_jobsets.yaml").read_text())
        cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def elastic_kube(elastic_cluster):
    from trainyard.kube.client import KubeClient
    client = await KubeClient.from_kubeconfig(str(elastic_cluster.kubeconfig))
    try:
        # the data plane registers its JobSet webhook once it runs
        await wait_until(lambda: client.get(WEBHOOKS, None, "trainyard-dataplane-jobset"), timeout=60,
                         what="the data plane's JobSet webhook")
        yield client
    finally:
        await client.close()


def resize_patch(size: int, completions: int | None = None) -> str:
    base = "/spec/replicatedJobs/0/template/spec"
    return json.dumps([{"op": "replace", "path": f"{base}/parallelism", "value": size},
                       {"op": "replace", "path": f"{base}/completions",
                        "value": size if completions is None else completions}])


async def live_pods(kube, namespace: str) -> dict[int, dict]:
    found, _ = await kube.list(POD, namespace)
    return {int(p["metadata"]["labels"][INDEX]): p for p in found
            if not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") == "Running"}


def sleeper(size: int) -> dict:
    return jobset_object("elastic", "default", [
        replicated_job("node", ["sleep", "300"], parallelism=size, completions=size, completionMode="Indexed")])


async def test_resize_with_the_gate_keeps_survivors_and_moves_the_highest_index(elastic_cluster, elastic_kube):
    kube = elastic_kube
    await kube.create(JOBSET, "default", sleeper(2))
    start = await wait_until(lambda: _sized(kube, 2), what="2 running pods")
    uids = {index: p["metadata"]["uid"] for index, p in start.items()}
    job_uid = (await kube.get(JOB, "default", "elastic-node-0"))["metadata"]["uid"]

    elastic_cluster.kubectl("patch", "jobset", "elastic", "--type=json", "-p", resize_patch(3))
    grown = await wait_until(lambda: _sized(kube, 3), what="3 running pods")
    assert {i: grown[i]["metadata"]["uid"] for i in (0, 1)} == uids  # survivors untouched
    job = await kube.get(JOB, "default", "elastic-node-0")
    assert job["metadata"]["uid"] == job_uid  # resized in place, never recreated
    assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (3, 3)

    elastic_cluster.kubectl("patch", "jobset", "elastic", "--type=json", "-p", resize_patch(1))
    shrunk = await wait_until(lambda: _sized(kube, 1, gone=(1, 2)), what="only index 0 left")
    assert shrunk[0]["metadata"]["uid"] == uids[0]

    async def settled():
        status = ((await kube.get(JOB, "default", "elastic-node-0")) or {}).get("status") or {}
        return status if status.get("active") == 1 and not status.get("terminating") else None
    status = await wait_until(settled, what="the Job's counts after the scale-down")
    assert status.get("failed", 0) == 0  # removed pods are not failures
    assert not [c for c in status.get("conditions") or [] if c["type"] in ("Failed", "FailureTarget")]

    uneven = elastic_cluster.kubectl("patch", "jobset", "elastic", "--type=json", "-p", resize_patch(2, 3),
                                     check=False)
    assert uneven.returncode != 0
    assert ("spec.replicatedJobs[0].template.spec.completions: Invalid value: 3: completions must be equal to "
            "parallelism for Elastic Indexed Jobs") in uneven.stderr


async def _sized(kube, size: int, gone: tuple[int, ...] = ()) -> dict[int, dict] | None:
    pods = await live_pods(kube, "default")
    found, _ = await kube.list(POD, "default")
    if sorted(pods) != list(range(size)):
        return None
    if any(int(p["metadata"]["labels"][INDEX]) in gone for p in found):
        return None
    return pods


async def test_resize_without_the_gate_is_refused_naming_it(dataplane_cluster, kube, ns):
    """The data plane started without --jobset-feature-gates (JobSet's default: off)."""
    js = jobset_object("fixed", ns, [replicated_job("node", ["sleep", "300"], parallelism=2, completions=2,
                                                    completionMode="Indexed")])
    await kube.create(JOBSET, ns, js)
    job = await wait_until(lambda: kube.get(JOB, ns, "fixed-node-0"), what="the child Job")
    refused = dataplane_cluster.server.kubectl("patch", "jobset", "fixed", "-n", ns, "--type=json",
                                               "-p", resize_patch(3), check=False)
    assert refused.returncode != 0
    assert ("spec.replicatedJobs[0].template.spec: Forbidden: parallelism and completions cannot be changed "
            "when ElasticJobSet feature gate is disabled") in refused.stderr
    assert "spec.replicatedJobs: Invalid value: field is immutable" in refused.stderr
    unchanged = await kube.get(JOB, ns, "fixed-node-0")
    assert unchanged["metadata"]["uid"] == job["metadata"]["uid"]
    assert unchanged["spec"]["parallelism"] == 2
    await kube.request("DELETE", JOBSET.path(ns, "fixed"), body={"propagationPolicy": "Foreground"})


@pytest.mark.parametrize("value,message", [
    ("Elastic=true", "error: --jobset-feature-gates: unrecognized feature gate: Elastic"),
    ("RestartJob=true", "error: --jobset-feature-gates: feature gate RestartJob is not implemented by the "
                        "devcluster data plane"),
])
def test_a_bad_gate_flag_is_one_line_and_exit_2(tmp_path, value, message):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "trainyard.cli.main", "devcluster", "up", "--port", "0",
                           "--data-dir", str(tmp_path / "d"), "--jobset-feature-gates", value],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == message
