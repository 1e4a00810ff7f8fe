"""The TrainJob vocabulary the services share (trainyard.pipeline.trainjobs, trainyard.clock)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from trainyard.clock import format_time, parse_epoch, parse_time
from trainyard.pipeline.trainjobs import (creation_failed_message, home_trainjob, managed_by_trainer,
                                          owned_by_uid, owner_reference, partition_of, state_of)

OWNED = {"metadata": {"namespace": "ns", "name": "job-mpi-ssh-auth", "ownerReferences": [
    {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "job", "uid": "u1"}]}}


def test_owner_is_a_trainjob_of_the_trainer_group_only() -> None:
    assert owner_reference(OWNED)["name"] == "job"
    other = {"metadata": {"ownerReferences": [{"apiVersion": "example.com/v1", "kind": "TrainJob", "name": "x"}]}}
    assert owner_reference(other) is None
    assert owner_reference({"metadata": {"ownerReferences": None}}) is None
    assert owned_by_uid(OWNED, "u1") and not owned_by_uid(OWNED, "u2") and not owned_by_uid(None, "u1")


def test_home_trainjob_of_a_trainjob_a_child_and_a_runtime() -> None:
    assert home_trainjob("TrainJob", {"metadata": {"namespace": "ns", "name": "job"}}) == ("ns", "job")
    assert home_trainjob("Secret", OWNED) == ("ns", "job")
    assert home_trainjob("ClusterTrainingRuntime", {"metadata": {"name": "torch"}}) is None


def test_partition_is_stable_and_spread() -> None:
    assert partition_of("ns", "job", 1) == 0
    assert partition_of("ns", "job", 16) == partition_of("ns", "job", 16)
    # Fixed by the hash, not by the process (``hash()`` would differ per process).
    assert partition_of("default", "a", 16) == 0
    counts = [0] * 8
    for i in range(800):
        counts[partition_of("default", f"job-{i}", 8)] += 1
    assert min(counts) > 60 and max(counts) < 140


def test_managed_by() -> None:
    assert managed_by_trainer({"spec": {}}) and managed_by_trainer({"spec": {"managedBy": ""}})
    assert managed_by_trainer({"spec": {"managedBy": "trainer.kubeflow.org/trainjob-controller"}})
    assert not managed_by_trainer({"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}})


def test_creation_failed_message_cuts_once() -> None:
    message = creation_failed_message("e" * 1000)
    assert message == "TrainJob resources reconciliation failed: " + "e" * 950 + " ..."
    assert creation_failed_message(message) == message


def test_state_of() -> None:
    def cond(kind: str, reason: str = "") -> dict:
        return {"type": kind, "status": "True", "reason": reason}

    assert state_of(None) == "Pending"
    assert state_of({"conditions": [cond("Failed", "TrainJobResourcesCreationFailed")]}) == "Failed"
    assert state_of({"jobsStatus": [{"ready": 1}]}) == "Running"


def test_clock_round_trip() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert format_time(moment) == "2026-01-02T01:04:05Z"
    assert parse_time("2026-01-02T01:04:05Z") == moment
    assert parse_epoch("2026-01-02T01:04:05+00:00") == moment.timestamp()
    assert parse_time("yesterday") is None and parse_epoch(None) is None
