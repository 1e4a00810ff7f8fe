"""What `make demo` shows: the TrainJob state, and step/loss read from the training logs."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.cli.demo import DemoError, find_trainjob, last_step_and_loss
from trainyard.pipeline.trainjobs import state_of


def condition(kind: str, status: str = "True") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": "r", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ({}, "Pending"),
        ({"jobsStatus": [{"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0, "suspended": 0}]}, "Running"),
        ({"conditions": [condition("Suspended")]}, "Suspended"),
        ({"conditions": [condition("Suspended", "False"), condition("Complete")]}, "Complete"),
        ({"conditions": [condition("Failed")]}, "Failed"),
        ({"conditions": [condition("Complete", "False")]}, "Pending"),
    ],
)
def test_the_demo_shows_the_state_the_dashboard_shows(status: dict, state: str) -> None:
    assert state_of(status) == state


def test_latest_step_and_loss_are_read_from_the_log() -> None:
    log = "starting\nstep 1 loss 2.5\n[rank0] step=20 loss=0.125\nsaving model\n"
    assert last_step_and_loss(log) == ("20", "0.125", "saving model")


def test_loss_without_a_step_and_logs_without_either() -> None:
    assert last_step_and_loss("epoch 3: loss: 1e-3\n") == (None, "1e-3", "epoch 3: loss: 1e-3")
    assert last_step_and_loss("hello\n") == (None, None, "hello")
    assert last_step_and_loss("") == (None, None, "")


def test_finds_the_trainjob_in_an_example(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: script}\n---\n"
                                     "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n"
                                     "metadata: {name: ddp, namespace: team}\n")
    job = find_trainjob(tmp_path)
    assert (job.name, job.namespace) == ("ddp", "team")


def test_missing_example_or_trainjob_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match="not found"):
        find_trainjob(tmp_path / "absent")
    with pytest.raises(DemoError, match="no TrainJob found"):
        find_trainjob(tmp_path)
