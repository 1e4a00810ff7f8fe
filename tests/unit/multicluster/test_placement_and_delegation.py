"""Placement and the copy/mirror rules of multi-cluster delegation (pure functions)."""
from __future__ import annotations

from fractions import Fraction

import pytest

from trainyard.multicluster import delegation as d
from trainyard.pipeline.lifecycle import is_finished
from trainyard.multicluster.placement import (
    REASON_NO_CAPACITY, REASON_NO_RUNTIME, REASON_NO_WORKER, Worker, choose_worker, jobset_requests,
    node_allocatable, pods_in_use,
)

CPU = "cpu"


def node(cpu: str, memory: str = "8Gi", ready: str = "True", unschedulable: bool = False) -> dict:
    return {"spec": {"unschedulable": unschedulable} if unschedulable else {},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "conditions": [{"type": "Ready", "status": ready}]}}


def pod(cpu: str, phase: str = "Running", jobset: str | None = None, namespace: str = "default") -> dict:
    labels = {"jobset.sigs.k8s.io/jobset-name": jobset} if jobset else {}
    return {"metadata": {"namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": phase}}


def worker(name: str, cpu: int, used: float = 0, has_runtime: bool = True) -> Worker:
    return Worker(name, {CPU: Fraction(cpu), "pods": Fraction(110)}, {CPU: Fraction(used)}, has_runtime)


def test_allocatable_counts_ready_schedulable_nodes_only():
    total = node_allocatable([node("4"), node("2", ready="False"), node("8", unschedulable=True), node("500m")])
    assert total[CPU] == Fraction(9, 2)
    assert total["memory"] == 2 * 8 * 2**30


def test_pods_in_use_skip_finished_pods_and_pods_of_counted_trainjobs():
    pods = [pod("1"), pod("2", phase="Succeeded"), pod("3", phase="Failed"), pod("250m", jobset="mine"),
            pod("500m", phase="Pending")]
    assert pods_in_use(pods)[CPU] == Fraction(7, 4)
    assert pods_in_use(pods, excluded={("default", "mine")})[CPU] == Fraction(3, 2)
    assert pods_in_use(pods)["pods"] == 3


def test_jobset_requests_multiply_replicas_and_parallelism():
    jobset = {"spec": {"replicatedJobs": [
        {"name": "node", "replicas": 1, "template": {"spec": {"parallelism": 4, "template": {"spec": {
            "containers": [{"name": "node", "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "1"}}}]}}}}},
        {"name": "init", "template": {"spec": {"template": {"spec": {
            "containers": [{"name": "i", "resources": {"requests": {"cpu": "500m"}}}]}}}}},
    ]}}
    need = jobset_requests(jobset)
    assert need[CPU] == Fraction(17, 2)
    assert need["nvidia.com/gpu"] == 4
    assert need["pods"] == 5


@pytest.mark.parametrize("workers, need, expected", [
    # Least loaded after placement wins.
    ([worker("worker-1", 8, used=6), worker("worker-2", 8, used=2)], 1, "worker-2"),
    # A worker without the runtime is excluded even when emptier.
    ([worker("worker-1", 8, used=6), worker("worker-2", 8, has_runtime=False)], 1, "worker-1"),
    # Only one fits.
    ([worker("worker-1", 4, used=3), worker("worker-2", 16, used=14)], 2, "worker-2"),
    # Equal load: the name decides, so replicas agree.
    ([worker("worker-2", 8), worker("worker-1", 8)], 1, "worker-1"),
])
def test_choose_worker(workers, need, expected):
    placement = choose_worker({CPU: Fraction(need), "pods": Fraction(1)}, workers, "torch")
    assert placement.worker == expected
    assert placement.message == f"dispatched to worker cluster {expected}"


def test_no_worker_says_why():
    none = choose_worker({CPU: Fraction(1)}, [], "torch")
    assert (none.worker, none.reason) == (None, REASON_NO_WORKER)
    missing = choose_worker({CPU: Fraction(1)}, [worker("worker-1", 8, has_runtime=False)], "torch")
    assert (missing.worker, missing.reason) == (None, REASON_NO_RUNTIME)
    assert "runtime torch not found" in missing.message
    full = choose_worker({CPU: Fraction(3)}, [worker("worker-1", 4, used=2), worker("worker-2", 2)], "torch")
    assert (full.worker, full.reason) == (None, REASON_NO_CAPACITY)
    assert full.message.startswith("no worker cluster has free capacity for cpu=3 (worker-1: free cpu=2")
    assert full.message.endswith("waiting for capacity")


def manager_trainjob(**spec) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "job", "namespace": "team-a", "uid": "uid-1", "resourceVersion": "9",
                         "labels": {"app": "x"}, "finalizers": [d.FINALIZER],
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}",
                                         d.WORKER_ANNOTATION: "worker-1", "note": "kept"}},
            "spec": {"managedBy": d.MULTIKUEUE_MANAGED_BY, "runtimeRef": {"name": "torch"}, **spec},
            "status": {"conditions": [{"type": "Dispatched", "status": "True"}]}}


def test_worker_copy_drops_managed_by_and_server_fields_and_labels_the_origin():
    copy = d.worker_copy(manager_trainjob(suspend=True), "manager")
    assert copy["spec"] == {"runtimeRef": {"name": "torch"}, "suspend": True}
    assert copy["metadata"] == {"name": "job", "namespace": "team-a",
                                "labels": {"app": "x", d.ORIGIN_LABEL: "manager"},
                                "annotations": {"note": "kept", d.ORIGIN_UID_ANNOTATION: "uid-1"}}
    assert "status" not in copy
    assert d.copy_is_current(copy, manager_trainjob(), "manager")
    assert not d.copy_is_current(copy, {**manager_trainjob(), "metadata": {"uid": "uid-2"}}, "manager")
    assert not d.copy_is_current(copy, manager_trainjob(), "other-manager")


def test_referenced_configmaps_and_secrets_are_found_wherever_the_spec_names_them():
    trainjob = manager_trainjob(trainer={
        "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "sec-env", "key": "k"}}}],
    }, podTemplateOverrides=[{"targetJobs": [{"name": "node"}], "spec": {
        "volumes": [{"name": "v1", "configMap": {"name": "cm-vol"}}, {"name": "v2", "secret": {"secretName": "sec-vol"}},
                    {"name": "v3", "projected": {"sources": [{"configMap": {"name": "cm-proj"}},
                                                             {"secret": {"name": "sec-proj"}}]}}],
        "imagePullSecrets": [{"name": "pull"}],
        "containers": [{"name": "node", "envFrom": [{"configMapRef": {"name": "cm-from"}},
                                                     {"secretRef": {"name": "sec-from"}}]}]}}])
    configmaps, secrets = d.referenced_objects(trainjob)
    assert configmaps == {"cm-env", "cm-vol", "cm-proj", "cm-from"}
    assert secrets == {"sec-env", "sec-vol", "sec-proj", "sec-from", "pull"}


def test_mirrored_status_is_the_copys_with_dispatched_first():
    dispatched = {"type": "Dispatched", "status": "True", "reason": "Dispatched", "message": "to worker-1"}
    copy = {"status": {"conditions": [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted",
                                       "message": "jobset completed successfully"}],
                       "jobsStatus": [{"name": "node", "succeeded": 1}]}}
    mirrored = d.mirrored_status(manager_trainjob(), copy, dispatched)
    assert [c["type"] for c in mirrored["conditions"]] == ["Dispatched", "Complete"]
    assert mirrored["jobsStatus"] == [{"name": "node", "succeeded": 1}]
    # Re-dispatch: nothing of the lost copy stays.
    assert d.mirrored_status(manager_trainjob(), None, dispatched) == {"conditions": [dispatched]}
    assert is_finished(copy) and not is_finished({"status": {"conditions": [{"type": "Complete", "status": "False"}]}})


def test_trainjobs_that_hold_nothing_are_spread_over_equal_workers() -> None:
    """Suspended TrainJobs leave every worker's load as it was: they are spread by name, not
    all sent to the first worker (a bench put 147 of 147 on worker-1)."""
    from trainyard.multicluster.placement import Worker, choose_worker
    from fractions import Fraction

    workers = [Worker(f"worker-{i}", {"pods": Fraction(10)}, {}, True) for i in (1, 2)]
    chosen = [choose_worker({}, workers, "rt", spread_key=f"team/tj-{i}").worker for i in range(100)]
    assert 30 < chosen.count("worker-1") < 70
    assert chosen == [choose_worker({}, list(reversed(workers)), "rt", spread_key=f"team/tj-{i}").worker
                      for i in range(100)]  # the same answer whatever the order (replicas agree)


def test_stale_copies_are_those_the_manager_no_longer_points_at():
    import copy as deep

    current = manager_trainjob()  # placed on worker-1
    moved = deep.deepcopy(current)
    moved["metadata"].update(name="moved", annotations={d.WORKER_ANNOTATION: "worker-2"})
    recreated = deep.deepcopy(current)
    recreated["metadata"].update(name="recreated", uid="uid-new")
    copies = [d.worker_copy(tj, "manager") for tj in (current, moved)]
    old = deep.deepcopy(current)
    old["metadata"].update(name="recreated")  # the copy of the earlier TrainJob of that name (uid-1)
    gone, leaving = deep.deepcopy(current), deep.deepcopy(current)
    gone["metadata"]["name"], leaving["metadata"]["name"] = "gone", "leaving"
    copies += [d.worker_copy(tj, "manager") for tj in (old, gone, leaving)]
    copies[-1]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # being deleted: left alone
    stale = d.stale_copies(copies, [current, moved, recreated], "worker-1", "manager")
    assert [meta["name"] for meta in stale] == ["moved", "recreated", "gone"]


def test_holds_a_resync_keeps_are_those_of_trainjobs_that_may_run():
    running = manager_trainjob()
    suspended = manager_trainjob(suspend=True)
    suspended["metadata"]["name"] = "held"
    done = manager_trainjob()
    done["metadata"]["name"] = "done"
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert d.running_on([running, suspended, done]) == {"worker-1": {"team-a/job"}}


def test_the_dispatched_condition_goes_first_and_replaces_the_previous_one():
    trainjob = manager_trainjob()
    trainjob["status"]["conditions"].append({"type": "Created", "status": "True"})
    condition = d.dispatched_condition("False", "WorkerLost", "gone", "2026-01-01T00:00:00Z", None)
    assert [c["type"] + c["status"] for c in d.with_dispatched(trainjob, condition)["conditions"]] == \
        ["DispatchedFalse", "CreatedTrue"]


def test_a_trainjob_failed_for_a_reason_that_is_not_final_keeps_its_hold() -> None:
    # The planner's Failed/TrainJobResourcesCreationFailed (or an unsupported runtime) resumes
    # once the cause is fixed: the dispatcher must not count it as done and give its slots back.
    def failed(name: str, reason: str) -> dict:
        trainjob = manager_trainjob()
        trainjob["metadata"]["name"] = name
        trainjob["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": reason}]}
        return trainjob

    held = d.running_on([failed("setup", "TrainJobResourcesCreationFailed"),
                         failed("runtime", "TrainingRuntimeNotSupported"), failed("ran", "JobSetFailed")])
    assert held == {"worker-1": {"team-a/setup", "team-a/runtime"}}
