"""Pure decisions inside the services (no bus, no cluster)."""
from __future__ import annotations


from trainyard.bus.envelopes import PlanMessage
from trainyard.bus.kv import AppliedPlan, Outcome
from trainyard.pipeline.trainjobs import managed_by_trainer, truncate_message
from trainyard.bus.claims import Wanted, remembered_hashes
from trainyard_services.applier.service import with_owner
from trainyard_services.planner.reconcile import owned_refs_for, owner_of, references_runtime
from trainyard_services.planner.service import trainjob_lane
from trainyard.pipeline.resolution import referenced_runtime
from trainyard.pipeline.status_fold import desired_status, transitions

RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch"},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
             "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}},
             "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                 "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                 "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}}}]}}},
}


def trainjob(suspend=False, **spec):
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "job", "namespace": "ns", "uid": "u1", "generation": 3},
            "spec": {"runtimeRef": {"name": "torch"}, "suspend": suspend, **spec}}


def running_jobset():
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "job", "namespace": "ns",
                         "ownerReferences": [{"kind": "TrainJob", "uid": "u1", "name": "job",
                                              "apiVersion": "trainer.kubeflow.org/v1alpha1"}]},
            "spec": {"suspend": False}}


def test_a_running_jobset_is_kept_in_owned_although_the_plan_leaves_it_alone():
    from trainyard.pipeline.planning import plan

    observed = [RUNTIME, running_jobset()]
    planned = plan(trainjob(), None, observed)
    kinds = [o["kind"] for o in planned.objects]
    assert "JobSet" not in kinds  # upstream never re-applies a running JobSet
    owned = {(r.kind, r.name) for r in owned_refs_for(trainjob(), observed, list(planned.objects))}
    assert ("JobSet", "job") in owned and ("PodGroup", "job") in owned


def test_a_kept_flux_curve_secret_stays_owned_and_unplanned():
    from trainyard.pipeline.planning import plan

    flux = {**RUNTIME, "metadata": {"name": "flux"},
            "spec": {**RUNTIME["spec"], "mlPolicy": {"numNodes": 1, "flux": {}}}}
    job = trainjob(runtimeRef={"name": "flux"}, trainer={"numNodes": 2})
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "job-flux-curve", "namespace": "ns",
                           "ownerReferences": [{"kind": "TrainJob", "uid": "u1", "name": "job"}]}}
    observed = [flux, secret]
    planned = plan(job, None, observed)
    assert [(o["kind"], o["metadata"]["name"]) for o in planned.objects] == [
        ("ConfigMap", "job-runtime-snapshot"), ("PodGroup", "job"), ("ConfigMap", "job-flux-entrypoint"),
        ("JobSet", "job")]
    owned = {(r.kind, r.name) for r in owned_refs_for(job, observed, list(planned.objects))}
    assert ("Secret", "job-flux-curve") in owned and ("ConfigMap", "job-flux-entrypoint") in owned
    assert ("ConfigMap", "job-runtime-snapshot") in owned


def test_the_runtime_snapshot_is_read_and_stays_owned_once_children_exist():
    """The snapshot is among the keys planning reads (whoever owns it: planning reports one owned by
    another object), and it stays owned when the owned objects are planned without the children."""
    from trainyard.pipeline.planning import plan
    from trainyard_services.planner.reconcile import observed_keys

    assert ("ConfigMap", "ns", "job-runtime-snapshot") in {(k.kind, k.namespace, k.name)
                                                          for k in observed_keys("c", trainjob())}
    first = plan(trainjob(), None, [RUNTIME]).objects
    snapshot = first[0]
    edited = {**RUNTIME, "spec": {**RUNTIME["spec"], "mlPolicy": {"numNodes": 7}}}
    jobset = next(o for o in first if o["kind"] == "JobSet")
    observed = [edited, snapshot, jobset]
    again = plan(trainjob(), None, observed).objects
    assert again[0] == snapshot
    owned = {(r.kind, r.name) for r in owned_refs_for(trainjob(), observed, list(again))}
    assert ("ConfigMap", "job-runtime-snapshot") in owned and ("JobSet", "job") in owned


def test_first_plan_owns_exactly_what_it_applies():
    from trainyard.pipeline.planning import plan

    planned = plan(trainjob(), None, [RUNTIME])
    owned = owned_refs_for(trainjob(), [RUNTIME], list(planned.objects))
    assert [(r.kind, r.name) for r in owned] == [(o["kind"], o["metadata"]["name"]) for o in planned.objects]


def test_managed_by_and_runtime_references():
    assert managed_by_trainer(trainjob())
    assert managed_by_trainer(trainjob(managedBy="trainer.kubeflow.org/trainjob-controller"))
    assert not managed_by_trainer(trainjob(managedBy="kueue.x-k8s.io/multikueue"))
    assert references_runtime(trainjob(), "ClusterTrainingRuntime", "torch")
    assert not references_runtime(trainjob(), "TrainingRuntime", "torch")
    assert owner_of(running_jobset()) == "job"
    assert owner_of({"metadata": {"ownerReferences": [{"kind": "Job", "name": "x"}]}}) is None


def test_children_share_their_trainjobs_lane():
    assert trainjob_lane("ty.events.c.JobSet.ns.job") == trainjob_lane("ty.events.c.TrainJob.ns.job")
    assert trainjob_lane("ty.events.c.Secret.ns.job-mpi-ssh-auth") == "ns.job"
    assert trainjob_lane("ty.events.c.Secret.ns.job-flux-curve") == "ns.job"
    assert trainjob_lane("ty.events.c.ConfigMap.ns.job-flux-entrypoint") == "ns.job"
    assert trainjob_lane("ty.events.c.TrainJob.ns.a") != trainjob_lane("ty.events.c.TrainJob.ns.b")


def test_status_folds_jobset_completion_and_suspension():
    jobset = running_jobset() | {"status": {"conditions": [
        {"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
         "message": "jobset completed successfully", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    status = desired_status(trainjob(), jobset, None, "2026-02-02T00:00:00Z")
    assert status["conditions"] == [{"type": "Complete", "status": "True",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z",
                                     "reason": "AllJobsCompleted", "message": "jobset completed successfully"}]
    suspended = desired_status(trainjob(suspend=True), None, None, "2026-02-02T00:00:00Z")
    assert [(c["type"], c["status"], c["reason"]) for c in suspended["conditions"]] == \
        [("Suspended", "True", "Suspended")]
    # The State printer column is upstream's (last condition); Status is never blank.
    assert (status["state"], suspended["state"]) == ("Complete", "Suspended")


def test_a_failure_outcome_is_a_failed_condition_until_it_clears():
    outcome = Outcome(uid="u1", generation=3, stage="plan", reason="TrainJobResourcesCreationFailed",
                      message='not found ClusterTrainingRuntime specified in TrainJob: x')
    status = desired_status(trainjob(), None, outcome, "2026-02-02T00:00:00Z")
    failed = status["conditions"][0]
    assert (failed["type"], failed["status"], failed["reason"]) == \
        ("Failed", "True", "TrainJobResourcesCreationFailed")
    assert failed["message"] == "TrainJob resources reconciliation failed: " \
        "not found ClusterTrainingRuntime specified in TrainJob: x"
    # An outcome of an earlier TrainJob with the same name does not count.
    assert status["state"] == "Failed"
    assert desired_status(trainjob(), None, outcome.model_copy(update={"uid": "old"}), "t") == {"state": "Running"}
    # Gone again on the next fold without the outcome (Failed is re-derived each time).
    assert desired_status(trainjob() | {"status": status}, None, None, "t") == {"state": "Running"}


def test_transitions_name_new_and_changed_conditions_once():
    before = {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended"}]}
    after = {"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed"},
                            {"type": "Failed", "status": "True", "reason": "TrainJobResourcesCreationFailed"}]}
    assert [c["reason"] for c in transitions(before, after)] == ["Resumed"]
    assert transitions(after, after) == []
    # A resume drops the Suspended condition: it is still one Resumed event.
    dropped = {"conditions": []}
    assert [(c["reason"], c["message"]) for c in transitions(before, dropped)] == [
        ("Resumed", "TrainJob is resumed")]
    assert transitions(dropped, dropped) == []


def test_runtime_reference_needs_the_trainer_group():
    job = trainjob()
    job["spec"]["runtimeRef"] = {"name": "torch", "kind": "TrainingRuntime", "apiGroup": "trainer.kubeflow.org"}
    assert referenced_runtime(job) == ("TrainingRuntime", "ns", "torch")
    job["spec"]["runtimeRef"]["apiGroup"] = ""
    assert referenced_runtime(job) is None


def plan_message(**kw):
    base = dict(cluster="c", namespace="ns", name="job", uid="u1", generation=3, planHash="h3")
    return PlanMessage(**(base | kw))


def test_objects_get_the_controller_reference_once():
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "ns"}}
    owned = with_owner(obj, plan_message())
    assert owned["metadata"]["ownerReferences"] == [{
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "job", "uid": "u1",
        "controller": True, "blockOwnerDeletion": True}]
    assert with_owner(owned, plan_message()) is owned
    assert "ownerReferences" not in obj["metadata"]


def _wanted(plan) -> Wanted:
    return Wanted(plan.uid, plan.generation, plan.plan_hash, plan.inputs)


def test_applied_hashes_are_remembered_per_generation():
    previous = AppliedPlan(uid="u1", generation=3, planHash="h1", hashes=["h1"])
    assert remembered_hashes(previous, _wanted(plan_message(planHash="h2"))) == ["h1", "h2"]
    assert remembered_hashes(previous, _wanted(plan_message(generation=4, planHash="h4"))) == ["h4"]
    assert remembered_hashes(None, _wanted(plan_message())) == ["h3"]


def test_error_text_is_cut_like_upstreams_event():
    assert truncate_message("x" * 950) == "x" * 950
    assert truncate_message("x" * 951) == "x" * 950 + " ..."


def test_elastic_resize_refused_is_no_failure_and_a_resize_is_named():
    from trainyard_services.status.service import resized

    jobset = running_jobset()
    jobset["metadata"]["annotations"] = {"trainyard.kubeflow.org/elastic-policy": '{"maxNodes":3,"minNodes":1}'}
    jobset["spec"] = {"replicatedJobs": [{"name": "node", "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": {"parallelism": 2, "completions": 2}}}]}
    job = trainjob()
    job["spec"]["trainer"] = {"numNodes": 3}
    outcome = Outcome(uid="u1", generation=3, stage="apply", reason="TrainJobResourcesCreationFailed",
                      message="TrainJob resources reconciliation failed: ElasticJobSet feature gate is off")
    status = desired_status(job, jobset, outcome, "2026-02-02T00:00:00Z")
    assert status["elastic"]["currentNodes"] == 2 and status["elastic"]["desiredNodes"] == 3
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == \
        [("Resizing", "False", "ResizeRefused")]
    assert status["state"] == "Running"
    assert transitions({}, status) == []  # its Warning event is recorded with the apply result
    # The refusal clears with the outcome; the JobSet's new size is a resize from 2 to 3.
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"].update(parallelism=3, completions=3)
    after = desired_status(job | {"status": status}, jobset, None, "t")
    assert "conditions" not in after
    assert resized(status, after) == (2, 3)
    assert resized(after, after) is None


def test_the_stored_runtime_decides_whether_priority_classes_are_read():
    """A deleted Volcano runtime whose snapshot remains still needs the PriorityClasses."""
    from trainyard.pipeline.planning import plan
    from trainyard_services.planner.reconcile import _uses_volcano, stored_runtime

    volcano = {**RUNTIME, "spec": {**RUNTIME["spec"], "podGroupPolicy": {"volcano": {}}}}
    snapshot = plan(trainjob(), None, [volcano]).objects[0]
    assert _uses_volcano(stored_runtime(snapshot))
    assert not _uses_volcano(stored_runtime(plan(trainjob(), None, [RUNTIME]).objects[0]))
    assert stored_runtime({"data": {"runtime": "spec: [unclosed"}}) is None
    assert stored_runtime({"data": {}}) is None and stored_runtime(None) is None
