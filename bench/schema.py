"""Micro-benchmark of the devcluster's custom-resource write path (prune, default, validate with
the CRDs' CEL rules), in process, no server.

Prints microseconds per write for: a TrainJob create, a TrainJob update (suspend toggled: the
transition rules see unchanged values), a TrainJob update that changes an immutable field (a CEL
rejection), a TrainingRuntime create, and ``trainyard validate``'s schema step on a TrainJob.

    .venv/bin/python bench/schema.py [--rounds 2000]
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[1]

from trainyard.pipeline.validation import trainjob_schema_errors
from trainyard_services.devcluster.apiserver.errors import ApiError
from trainyard_services.devcluster.apiserver.registry.kinds import types_from_crd
from trainyard_services.devcluster.apiserver.registry.store import WriteOptions
from trainyard_services.devcluster.apiserver.registry.schema import SchemaProcessor

CRDS = REPO / "deploy" / "crds"


def resource_type(file_name: str) -> Any:
    return types_from_crd(yaml.safe_load((CRDS / file_name).read_text()))[0]


def trainjob(**spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "bench-job", "labels": {"team": "bench"}},
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "initializer": {"dataset": {"storageUri": "hf://tiny"}},
                     "trainer": {"numNodes": 2, "image": "busybox", "args": ["--epochs", "1"],
                                 "env": [{"name": f"E{i}", "value": str(i)} for i in range(5)]}}}
    body["spec"].update(spec)
    return body


def runtime() -> dict[str, Any]:
    job = {"name": "node", "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                        "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
            "metadata": {"name": "bench-rt", "namespace": "default"},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
                     "template": {"spec": {"replicatedJobs": [job]}}}}


def per_call_us(fn: Callable[[], Any], rounds: int) -> float:
    fn()  # compile and cache the rules first: steady state is what a server sees
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - start) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2000)
    rounds = parser.parse_args().rounds
    processor, tj_type, rt_type = SchemaProcessor(), resource_type("trainer.kubeflow.org_trainjobs.yaml"), \
        resource_type("trainer.kubeflow.org_trainingruntimes.yaml")
    stored = processor.process(tj_type, trainjob(), None, WriteOptions())
    changed = trainjob(trainer={**trainjob()["spec"]["trainer"], "image": "other"})

    def rejected() -> None:
        try:
            processor.process(tj_type, copy.deepcopy(changed), stored, WriteOptions())
        except ApiError:
            return
        raise AssertionError("the immutable trainer change was accepted")

    figures = {
        "trainjob create": lambda: processor.process(tj_type, trainjob(), None, WriteOptions()),
        "trainjob update (suspend)": lambda: processor.process(tj_type, trainjob(suspend=True), stored, WriteOptions()),
        "trainjob update rejected by CEL": rejected,
        "trainingruntime create": lambda: processor.process(rt_type, runtime(), None, WriteOptions()),
        "trainyard validate schema step": lambda: trainjob_schema_errors(stored, None),
    }
    for label, fn in figures.items():
        print(f"{label:34s} {per_call_us(fn, rounds):8.1f} us/write")


if __name__ == "__main__":
    main()
