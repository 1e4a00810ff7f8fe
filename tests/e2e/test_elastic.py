"""Elastic PyTorch on `trainyard up` (issue #17): the examples/elastic TrainJob starts at 2 nodes,
is scaled to 3 and then to 1 with `kubectl scale` while it trains, loses one trainer pod to a
SIGKILL, and completes; the global step never goes back to 0 and the loss falls. Scaling outside
the runtime's bounds is refused. A second TrainJob whose workers keep failing spends torchrun's
restart budget and ends Failed with a reason that says so. A third, suspended, has metrics: its
HorizontalPodAutoscaler is applied, owned by it, and goes with it.

One stack, one test: the two TrainJobs train side by side (each stack start and torch process
start costs seconds on a small machine)."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from fixtures.stack import REPO, RunningStack, skip_unless_stack_available, start_stack
from fixtures.waiting import wait_for as poll

EXAMPLE = REPO / "examples" / "elastic"
NAMESPACE = "default"
NAME = "elastic"
FAILING = "elastic-fails"
LINE = re.compile(r"^(?P<time>[\d.]+) (?:start )?step=(?P<step>\d+)(?: loss=(?P<loss>[\d.]+))? "
                  r"world=(?P<world>\d+) nodes=(?P<nodes>\S+) restart=(?P<restart>\d+)$")

FAILING_RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainingRuntime
metadata: {name: torch-elastic-one-restart, namespace: default}
spec:
  mlPolicy:
    torch:
      numProcPerNode: 1
      elasticPolicy: {minNodes: 1, maxNodes: 2, maxRestarts: 1}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata:
              labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime
                      env: [{name: OMP_NUM_THREADS, value: "1"}]
"""


HPA_JOB = "elastic-hpa"
HPA_RUNTIME_AND_JOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainingRuntime
metadata: {name: torch-elastic-hpa, namespace: default}
spec:
  mlPolicy:
    torch:
      elasticPolicy:
        minNodes: 1
        maxNodes: 4
        metrics:
          - type: Resource
            resource: {name: cpu, target: {type: Utilization, averageUtilization: 80}}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata:
              labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}
            spec:
              template:
                spec:
                  containers: [{name: node, image: pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime}]
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: elastic-hpa, namespace: default}
spec:
  runtimeRef: {name: torch-elastic-hpa, kind: TrainingRuntime}
  suspend: true
  trainer: {numNodes: 2, command: [torchrun, /opt/elastic/train.py]}
"""


def failing_trainjob() -> str:
    """The example's TrainJob on a budget of one restart, whose workers fail at step 3."""
    import yaml

    doc = yaml.safe_load((EXAMPLE / "trainjob.yaml").read_text())
    doc["metadata"]["name"] = FAILING
    doc["spec"]["runtimeRef"] = {"name": "torch-elastic-one-restart", "kind": "TrainingRuntime"}
    doc["spec"]["trainer"]["numNodes"] = 1
    env = [e for e in doc["spec"]["trainer"]["env"] if e["name"] not in ("CHECKPOINT_DIR", "STEP_SECONDS")]
    doc["spec"]["trainer"]["env"] = env + [{"name": "CHECKPOINT_DIR", "value": f"/checkpoints/{FAILING}"},
                                           {"name": "FAIL_AT_STEP", "value": "3"},
                                           {"name": "STEP_SECONDS", "value": "0"}]
    return yaml.safe_dump(doc)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120, interval: float = 0.5) -> Any:
    return poll(check, timeout=timeout, interval=interval, what=what)


_FOUND: dict[tuple[str, str], Path] = {}


def checkpoint_dir(stack: RunningStack, job: str) -> Path | None:
    """The job's directory on the claim every pod mounts (devcluster keeps claims on disk)."""
    key = (str(stack.data_dir), job)
    if key not in _FOUND:
        found = [p for p in (stack.data_dir / "devcluster").rglob(f"elastic-checkpoints/{job}") if p.is_dir()]
        if not found:
            return None
        _FOUND[key] = found[0]
    return _FOUND[key]


def set_train_steps(stack: RunningStack, job: str, steps: int) -> None:
    """The example's knob for the length of a running job (examples/elastic/train.py)."""
    directory = checkpoint_dir(stack, job)
    assert directory is not None
    (directory / "train_steps.tmp").write_text(str(steps))
    (directory / "train_steps.tmp").rename(directory / "train_steps")


def progress(stack: RunningStack, job: str) -> list[dict[str, Any]]:
    """Rank 0's lines, from the checkpoint volume (it outlives the pods)."""
    directory = checkpoint_dir(stack, job)
    if directory is None or not (directory / "progress.log").exists():
        return []
    lines = []
    for text in (directory / "progress.log").read_text().splitlines():
        match = LINE.match(text)
        if match:
            entry = {k: v for k, v in match.groupdict().items()}
            entry["start"] = " start " in f" {text} "
            lines.append(entry)
    return lines


def trainer_pods(stack: RunningStack, job: str) -> dict[str, dict[str, Any]]:
    """Running or pending trainer pods by completion index."""
    pods = json.loads(stack.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"jobset.sigs.k8s.io/jobset-name={job}",
                                    "-o", "json").stdout)["items"]
    return {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in pods
            if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") in ("Pending", "Running")}


def world_reached(stack: RunningStack, size: int, after: float) -> bool:
    """The group trains at ``size`` nodes since ``after``: three steps at that size."""
    return sum(int(e["world"]) == size and float(e["time"]) > after and not e["start"]
               for e in progress(stack, NAME)) >= 3


def sigkill_pod(uid: str) -> int:
    """Kill every process of the pod at once (as the OOM killer or a lost node would)."""
    needle = f"TRAINYARD_POD_UID={uid}".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle not in handle.read().split(b"\0"):
                    continue
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return killed


def scale(stack: RunningStack, job: str, replicas: int, check: bool = True):
    return stack.kubectl("scale", "-n", NAMESPACE, f"trainjob/{job}", f"--replicas={replicas}", check=check)


@pytest.mark.torch
@pytest.mark.timeout(420)
def test_elastic_resize_kill_resume_and_restart_budget(tmp_path: Path) -> None:
    skip_unless_stack_available()
    stack = start_stack(tmp_path / "data")
    timeline: list[str] = []
    started = time.monotonic()

    def note(text: str) -> None:
        timeline.append(f"{time.monotonic() - started:6.1f}s {text}")

    try:
        stack.kubectl("apply", "-k", str(EXAMPLE))
        stack.kubectl("apply", "-f", "-", stdin=FAILING_RUNTIME)
        stack.kubectl("apply", "-f", "-", stdin=failing_trainjob())
        stack.kubectl("apply", "-f", "-", stdin=HPA_RUNTIME_AND_JOB)  # suspended: no pods
        note("applied: elastic at 2 nodes; elastic-fails at 1 node, maxRestarts 1")

        wait_for("2 nodes training", lambda: any(int(e["world"]) == 2 and int(e["step"]) >= 2
                                                 for e in progress(stack, NAME)))
        set_train_steps(stack, NAME, 1000)  # long enough for every step below; ended at the end
        note("training with 2 nodes")
        before = {index: pod["metadata"]["uid"] for index, pod in trainer_pods(stack, NAME).items()}
        assert sorted(before) == ["0", "1"]

        refused = scale(stack, NAME, 4, check=False)
        assert refused.returncode != 0
        assert "spec.trainer.numNodes: Invalid value: 4: must be between minNodes (1) and maxNodes (3) of the " \
               "runtime's torch elasticPolicy" in refused.stderr
        note("kubectl scale --replicas=4 refused")

        mark = time.time()
        scale(stack, NAME, 3)
        note("scaled to 3")
        wait_for("3 nodes training", lambda: world_reached(stack, 3, mark))
        note("training with 3 nodes")
        after = {index: pod["metadata"]["uid"] for index, pod in trainer_pods(stack, NAME).items()}
        assert sorted(after) == ["0", "1", "2"]
        assert {i: after[i] for i in before} == before  # survivors untouched: only a pod added

        mark = time.time()
        assert sigkill_pod(after["1"]) > 0
        note("SIGKILLed the pod of index 1")
        wait_for("a replacement pod", lambda: (trainer_pods(stack, NAME).get("1") or {}).get(
            "metadata", {}).get("uid") not in (None, after["1"]))
        wait_for("3 nodes training again", lambda: world_reached(stack, 3, mark))
        note("training with 3 nodes again (replacement pod joined)")

        mark = time.time()
        scale(stack, NAME, 1)
        note("scaled to 1")
        wait_for("1 node training", lambda: world_reached(stack, 1, mark))
        note("training with 1 node")
        assert trainer_pods(stack, NAME)["0"]["metadata"]["uid"] == before["0"]  # node 0 never replaced
        last = max(int(e["step"]) for e in progress(stack, NAME))
        set_train_steps(stack, NAME, last + 4)

        stack.kubectl("wait", "-n", NAMESPACE, f"trainjob/{NAME}", "--for=condition=Complete", "--timeout=180s",
                      timeout=200)
        note("Complete")
        trainjob = json.loads(stack.kubectl("get", "-n", NAMESPACE, f"trainjob/{NAME}", "-o", "json").stdout)
        assert trainjob["status"]["elastic"]["desiredNodes"] == 1
        events = json.loads(stack.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                          f"involvedObject.name={NAME},reason=Resized", "-o", "json").stdout)
        messages = {e["message"] for e in events["items"]}
        assert {"resized from 2 to 3 nodes", "resized from 3 to 1 nodes"} <= messages

        lines = progress(stack, NAME)
        steps = [int(e["step"]) for e in lines if not e["start"]]
        starts = [int(e["step"]) for e in lines if e["start"]]
        assert starts[0] == 0 and all(step > 0 for step in starts[1:]), starts  # resumed, never from 0
        assert steps[-1] >= last + 4
        losses = [float(e["loss"]) for e in lines if e["loss"]]
        assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 / 2, losses  # the loss falls

        failed = stack.kubectl("wait", "-n", NAMESPACE, f"trainjob/{FAILING}", "--for=condition=Failed",
                               "--timeout=120s", timeout=140)
        assert failed.returncode == 0
        condition = next(c for c in json.loads(stack.kubectl(
            "get", "-n", NAMESPACE, f"trainjob/{FAILING}", "-o", "json").stdout)["status"]["conditions"]
            if c["type"] == "Failed")
        assert condition["reason"] == "ElasticRestartsExhausted"
        assert condition["message"].startswith(
            "torchrun exited non-zero after spending its restart budget (maxRestarts: 1)")
        restarts = {int(e["restart"]) for e in progress(stack, FAILING)}
        assert restarts == {0, 1}  # one restart in place of the failed workers, then final
        note("elastic-fails: Failed/ElasticRestartsExhausted")

        hpa = json.loads(stack.kubectl("get", "horizontalpodautoscalers.autoscaling", HPA_JOB, "-n", NAMESPACE,
                                       "-o", "json").stdout)
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                 "name": HPA_JOB}
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
        assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 80
        owner = hpa["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainJob", HPA_JOB, True)
        stack.kubectl("delete", "trainjob", HPA_JOB, "-n", NAMESPACE, "--wait=true", timeout=60)
        wait_for("the HPA deleted with its TrainJob", lambda: stack.kubectl(
            "get", "horizontalpodautoscalers.autoscaling", HPA_JOB, "-n", NAMESPACE, check=False).returncode != 0,
            timeout=30)
        note("HPA planned, applied, owned; deleted with its TrainJob")
        sizes = [(round(float(e["time"]) - float(lines[0]["time"]), 1), int(e["world"]), int(e["step"]))
                 for e in lines if e["start"]]
        print("\n".join(timeline))
        timeline.clear()
        print("group starts (s since first, nodes, resumed at step):", sizes)
        print("step/loss/nodes:", [(int(e["step"]), float(e["loss"]), int(e["world"])) for e in lines if e["loss"]])
    except BaseException:
        print("\n".join(timeline))
        for args in (("get", "trainjobs,jobsets,jobs,pods", "-n", NAMESPACE, "-o", "wide"),
                     ("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"),
                     ("get", "trainjob", NAME, "-n", NAMESPACE, "-o", "jsonpath={.status}")):
            print(stack.kubectl(*args, check=False).stdout)
        for job in (NAME, FAILING):
            print(job, [f"{e['step']}/{e['world']}/{e['restart']}{'S' if e['start'] else ''}"
                        for e in progress(stack, job)])
        raise
    finally:
        stack.stop()
