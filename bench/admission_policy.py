"""Cost of ValidatingAdmissionPolicy on a write: devcluster creating TrainJobs with and without
the tenant policies of deploy/policy (a real `trainyard devcluster up` process over HTTPS),
plus the evaluation alone, in process.

    .venv/bin/python bench/admission_policy.py [--objects 500] [--concurrency 16]

Prints creates/s without policies, with deploy/policy bound (four policies, three with a
ConfigMap parameter, every TrainJob matched and admitted), and the microseconds one
`admission_policy.evaluate` of those four policies takes for one TrainJob create.
"""
from __future__ import annotations

import argparse
import asyncio
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from fixtures.devcluster import start_devcluster  # noqa: E402

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "team-a", "labels": {"trainyard.kubeflow.org/tenant": "team-a"}}}
PARAMS = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "trainyard-tenant-policy", "namespace": "team-a"},
          "data": {"allowedRuntimes": "torch-distributed", "maxNodes": "4", "maxAccelerators": "8"}}


def trainjob(name: str) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}}}}}


async def creates(url: str, token: str, ca: Path, prefix: str, count: int, concurrency: int) -> float:
    ctx = ssl.create_default_context(cafile=str(ca))
    path = f"{url}/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        async def one(i: int) -> None:
            async with semaphore:
                async with session.post(path, json=trainjob(f"{prefix}-{i}"), ssl=ctx) as resp:
                    if resp.status != 201:
                        raise RuntimeError(f"create answered {resp.status}: {await resp.text()}")
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        return count / (time.perf_counter() - started)


def kubectl(cluster, *args: str, stdin: str | None = None) -> None:
    cluster.kubectl(*args, input=stdin, timeout=120)


def in_process(rounds: int) -> float:
    from trainyard.apimachinery.admission_policy import Attributes, evaluate
    docs = [d for d in yaml.safe_load_all(subprocess.run(
        [str(REPO / ".venv" / "bin" / "kubectl"), "kustomize", str(REPO / "deploy" / "policy")],
        capture_output=True, text=True, check=True).stdout) if d]
    policies = [dict(d, metadata=dict(d["metadata"], uid=d["metadata"]["name"], generation=1))
                for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    namespace = dict(NAMESPACE)
    job = trainjob("bench")
    job["spec"]["managedBy"] = "trainer.kubeflow.org/trainjob-controller"

    class Source:
        def namespace(self, name):
            return namespace

        def param_kind_scope(self, api_version, kind):
            return True

        def get_param(self, api_version, kind, ns, name):
            return PARAMS

        def list_params(self, api_version, kind, ns):
            return [PARAMS]

    attrs = Attributes(operation="CREATE", group="trainer.kubeflow.org", version="v1alpha1", resource="trainjobs",
                       kind="TrainJob", namespaced=True, name="bench", namespace="team-a", object=job,
                       user_info={"username": "alice", "groups": ["system:authenticated"]})
    source = Source()
    assert evaluate(policies, bindings, attrs, source).denial is None
    started = time.perf_counter()
    for _ in range(rounds):
        evaluate(policies, bindings, attrs, source)
    return (time.perf_counter() - started) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = start_devcluster(Path(tmp) / "dc")
        try:
            kubectl(cluster, "apply", "--server-side", "-k", str(REPO / "deploy" / "crds"))
            kubectl(cluster, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all([NAMESPACE, PARAMS]))
            plain = asyncio.run(creates(cluster.url, cluster.token, cluster.ca_cert, "plain", args.objects,
                                        args.concurrency))
            kubectl(cluster, "apply", "--server-side", "-k", str(REPO / "deploy" / "policy"))
            policed = asyncio.run(creates(cluster.url, cluster.token, cluster.ca_cert, "policed", args.objects,
                                          args.concurrency))
        finally:
            cluster.stop()
    print(f"TrainJob creates/s without policies:      {plain:8.0f}")
    print(f"TrainJob creates/s with deploy/policy:    {policed:8.0f}")
    print(f"evaluate() of the four policies, in process: {in_process(2000):8.0f} us per TrainJob create")


if __name__ == "__main__":
    main()
