"""Manifests shared by the API server tests (the project's CRDs and a small runtime and job)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CRD_DIR = REPO / "deploy" / "crds"
TRAINER_CRDS = sorted(CRD_DIR.glob("trainer.kubeflow.org_*.yaml"))

RUNTIME = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: torch-distributed
  labels:
    trainer.kubeflow.org/framework: torch
spec:
  mlPolicy:
    numNodes: 1
    torch:
      numProcPerNode: auto
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime
                      command: ["/bin/bash", "-c", "echo hi"]
"""


def trainjob(name: str, num_nodes: int = 2, labels: str = "") -> str:
    return f"""\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {name}
  labels:
    team: "a"{labels}
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    numNodes: {num_nodes}
"""


def install_trainer_crds(cluster) -> None:
    for crd in TRAINER_CRDS:
        cluster.kubectl("create", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", "crd/trainjobs.trainer.kubeflow.org", "--timeout=20s")
