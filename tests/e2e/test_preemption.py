"""A preempted TrainJob resumes where it stopped (issue #26), on `trainyard up` with real torch:
examples/preemption (torch-ddp-cpu on a runtime whose JobSet has a checkpoint claim) trains,
is evicted the way Kueue does it (``spec.suspend: true``: the kubelet sends SIGTERM, rank 0
saves a checkpoint, the pods go), and is re-admitted with a runtime patch that moves it to
other nodes (``nodeSelector``) and ``suspend: false``. Training goes on from the saved step: the
global step never goes back, the loss goes on from where it was; the TrainJob's status, its
Events and the dashboard timeline show the suspension and the resume with their steps.

The step sequence across the eviction is printed (``pytest -s``) for the record."""
from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from fixtures.stack import REPO, RunningStack, skip_unless_stack_available, start_stack
from fixtures.waiting import wait_for as poll

EXAMPLE = REPO / "examples" / "preemption"
NAMESPACE = "default"
NAME = "torch-ddp-preemptible"
POOL = "example.com/pool"
STEP = re.compile(r"^step (?P<step>\d+) loss (?P<loss>[\d.]+)$")
# The example runs 80 steps of 0.5 s so that a person has time to suspend it by hand; the test
# suspends it at step 13 and needs only a few steps after the resume, so it applies the example
# through an overlay with half the steps (the suspension still lands mid-training: 27 steps,
# 13 s, after the test sees step 13).
TRAIN_STEPS = 40
OVERLAY = """
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
sortOptions:
  order: fifo  # the runtime first, as in the example
resources:
  - {example}
patches:
  - target: {{group: trainer.kubeflow.org, kind: TrainJob, name: {name}}}
    patch: |-
      - op: replace
        path: /spec/trainer/env/0
        value: {{name: TRAIN_STEPS, value: "{steps}"}}
"""


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180, interval: float = 0.5) -> Any:
    return poll(check, timeout=timeout, interval=interval, what=what)


def pods(stack: RunningStack) -> list[dict[str, Any]]:
    return json.loads(stack.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"jobset.sigs.k8s.io/jobset-name={NAME}",
                                    "-o", "json").stdout)["items"]


def trainjob(stack: RunningStack) -> dict[str, Any]:
    return json.loads(stack.kubectl("get", "trainjob", NAME, "-n", NAMESPACE, "-o", "json").stdout)


def rank0_log(stack: RunningStack, pod_name: str) -> list[str]:
    """Rank 0's output from the kubelet's log file (it outlives the pod)."""
    found = list((stack.data_dir / "devcluster").rglob(f"pods/{NAMESPACE}/{pod_name}/node.log"))
    return found[0].read_text(errors="replace").splitlines() if found else []


def steps_of(lines: list[str]) -> list[tuple[int, float]]:
    return [(int(m["step"]), float(m["loss"])) for m in map(STEP.match, lines) if m]


def node0(stack: RunningStack) -> dict[str, Any] | None:
    for pod in pods(stack):
        if pod["metadata"]["name"].startswith(f"{NAME}-node-0-0-") and not pod["metadata"].get("deletionTimestamp"):
            return pod
    return None


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def events(stack: RunningStack, **selector: str) -> list[dict[str, Any]]:
    fields = ",".join(f"involvedObject.{k}={v}" for k, v in selector.items())
    return json.loads(stack.kubectl("get", "events", "-n", NAMESPACE, "--field-selector", fields,
                                    "-o", "json").stdout)["items"]


def dashboard_timeline(stack: RunningStack) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{stack.state['dashboard_url'].rstrip('/')}/api/snapshot", timeout=10) as answer:
        rows = json.load(answer)["trainjobs"]
    return next((row["timeline"] for row in rows if row["name"] == NAME), [])


@pytest.mark.torch
@pytest.mark.timeout(600)
def test_evicted_trainjob_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    skip_unless_stack_available()
    stack = start_stack(tmp_path / "data")
    try:
        overlay = tmp_path / "overlay"
        overlay.mkdir()
        # kustomize takes a base directory by a relative path only
        (overlay / "kustomization.yaml").write_text(OVERLAY.format(
            example=os.path.relpath(EXAMPLE, overlay), name=NAME, steps=TRAIN_STEPS))
        stack.kubectl("apply", "-k", str(overlay))
        claim = wait_for("the checkpoint claim", lambda: json.loads(stack.kubectl(
            "get", "pvc", f"checkpoints-{NAME}", "-n", NAMESPACE, "-o", "json", check=False).stdout or "null"))
        assert claim["metadata"]["ownerReferences"][0]["kind"] == "JobSet"

        first = wait_for("rank 0's pod", lambda: node0(stack))
        first_name = first["metadata"]["name"]
        assert first["spec"]["terminationGracePeriodSeconds"] == 60  # from the runtime
        wait_for("a first checkpoint and a few steps more",
                 lambda: any(step >= 13 for step, _ in steps_of(rank0_log(stack, first_name))), timeout=300)

        # Kueue's eviction: suspend.
        stack.kubectl("patch", "trainjob", NAME, "-n", NAMESPACE, "--type", "merge", "-p", '{"spec":{"suspend":true}}')
        suspended = wait_for("Suspended=True", lambda: condition(trainjob(stack), "Suspended"))
        assert (suspended["status"], suspended["reason"], suspended["message"]) == \
            ("True", "Suspended", "TrainJob is suspended")
        wait_for("the pods gone", lambda: not pods(stack), timeout=120)
        before = rank0_log(stack, first_name)
        stopped = [line for line in before if line.startswith("SIGTERM: checkpoint saved at step ")]
        assert stopped, "rank 0 did not save on SIGTERM:\n" + "\n".join(before[-20:])
        saved = int(re.search(r"at step (\d+),", stopped[0]).group(1))
        checkpoints = sorted(p.name for p in (stack.data_dir / "devcluster").rglob(f"checkpoints-{NAME}/step-*.pt"))
        assert checkpoints[-1] == f"step-{saved:08d}.pt", checkpoints
        killing = [e for e in events(stack, name=first_name) if e["reason"] == "Killing"]
        assert killing and killing[0]["message"] == "Stopping container node"

        # Re-admission on other nodes: a runtime patch with a node selector, and resume.
        node = stack.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout
        stack.kubectl("label", "node", node, f"{POOL}=reserved", "--overwrite")
        wait_for("no active Jobs left", lambda: all(
            not j.get("active") for j in (trainjob(stack).get("status") or {}).get("jobsStatus") or []))
        patch = {"spec": {"suspend": False, "runtimePatches": [{
            "manager": "kueue.x-k8s.io/manager",
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                "spec": {"template": {"spec": {"nodeSelector": {POOL: "reserved"}}}}}}]}}}}]}}
        stack.kubectl("patch", "trainjob", NAME, "-n", NAMESPACE, "--type", "merge", "-p", json.dumps(patch))
        second = wait_for("rank 0's new pod", lambda: node0(stack))
        second_name = second["metadata"]["name"]
        assert second_name != first_name
        assert second["spec"]["nodeSelector"] == {POOL: "reserved"}

        stack.kubectl("wait", "-n", NAMESPACE, f"trainjob/{NAME}", "--for=condition=Complete", "--timeout=300s",
                      timeout=320)
        after = rank0_log(stack, second_name)
        assert f"resumed from step {saved}" in after, "\n".join(after[-20:])
        run1, run2 = steps_of(before), steps_of(after)
        print(f"\nstep sequence across the eviction: run 1 steps {run1[0][0]}..{run1[-1][0]} "
              f"(checkpoint saved on SIGTERM at step {saved}), run 2 steps {run2[0][0]}..{run2[-1][0]}")
        print("loss around the eviction: " + ", ".join(f"{s}:{loss:.4f}" for s, loss in run1[-3:]) + " | "
              + ", ".join(f"{s}:{loss:.4f}" for s, loss in run2[:3]))
        assert [s for s, _ in run1] == list(range(1, saved + 1))
        assert [s for s, _ in run2] == list(range(saved + 1, TRAIN_STEPS + 1))  # never back to 0, no step repeated
        # The loss goes on from where it was, not from the untrained model's.
        assert run2[0][1] < run1[0][1] / 2
        assert run2[0][1] <= run1[-1][1] * 1.5

        job = trainjob(stack)
        assert condition(job, "Suspended") is None  # dropped on resume (this project's choice, see trainyard.pipeline.status); an Event says so
        reasons = [e["reason"] for e in events(stack, name=NAME, kind="TrainJob")]
        assert "Suspended" in reasons and "Resumed" in reasons, reasons
        metrics = {m["name"]: m["value"] for m in job["status"]["trainerStatus"]["metrics"]}
        assert metrics["step"] == str(TRAIN_STEPS) and metrics["resumedFromStep"] == str(saved)

        timeline = wait_for("the dashboard's resume step", lambda: (lambda t: t if any(
            e["stage"] == "resumed" and e.get("step") is not None for e in t) else None)(dashboard_timeline(stack)),
            timeout=30)
        shown = [(e["stage"], e.get("detail")) for e in timeline]
        print(f"dashboard timeline: {shown}")
        assert ("suspended", f"at step {saved}") in shown and ("resumed", f"from step {saved}") in shown
        stages = [stage for stage, _ in shown]
        assert stages.index("suspended") < stages.index("resumed") < stages.index("finished")
    finally:
        stack.stop()
