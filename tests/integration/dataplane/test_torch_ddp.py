"""The torch-ddp-cpu example at the JobSet level: two copies at once, both on port 29500."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fixtures.dataplane import wait_until
from trainyard.kube.resources import CONFIGMAP, JOBSET, Resource

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torch-ddp-cpu"
NAMESPACE = Resource("", "v1", "namespaces", "Namespace", False)
POD = Resource("", "v1", "pods", "Pod")


def example_jobset(name: str, namespace: str) -> dict:
    doc = yaml.safe_load((EXAMPLE / "jobset.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    container = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    for var in container["env"]:
        if var["name"] == "PET_MASTER_ADDR":
            var["value"] = f"{name}-node-0-0.{name}"
    return doc


@pytest.mark.torch
async def test_two_torch_jobsets_train_at_once_and_loss_decreases(dataplane_cluster):
    kube = await dataplane_cluster.client()
    runs = [("torch-ddp-cpu", "torch-a"), ("torch-ddp-cpu-b", "torch-b")]
    try:
        for name, namespace in runs:
            await kube.create(NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": namespace}})
            await kube.create(CONFIGMAP, namespace, {
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "torch-ddp-cpu-script"},
                "data": {"train.py": (EXAMPLE / "train.py").read_text()}})
            await kube.create(JOBSET, namespace, example_jobset(name, namespace))

        async def finished(name, namespace):
            js = await kube.get(JOBSET, namespace, name)
            for condition in ((js or {}).get("status") or {}).get("conditions") or []:
                if condition["type"] in ("Completed", "Failed") and condition["status"] == "True":
                    return condition
            return None
        for name, namespace in runs:
            outcome = await wait_until(lambda: finished(name, namespace), timeout=100, interval=0.5,
                                       what=f"{name} finished")
            pods, _ = await kube.list(POD, namespace)
            logs = {p["metadata"]["name"]: (dataplane_cluster.data_dir / "pods" / namespace /
                                            p["metadata"]["name"] / "node.log").read_text() for p in pods}
            assert outcome["type"] == "Completed", logs
            rank0 = next(text for pod, text in logs.items() if pod.startswith(f"{name}-node-0-0-"))
            losses = [float(v) for v in re.findall(r"^step \d+ loss ([0-9.]+)$", rank0, re.M)]
            assert len(losses) == 30, rank0
            assert losses[-1] < losses[0] * 0.8
            assert "training complete" in rank0
            assert f"master {name}-node-0-0.{name}:29500" in rank0
    finally:
        await kube.close()
