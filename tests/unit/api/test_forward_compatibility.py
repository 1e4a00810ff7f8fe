"""Room for upstream v2.3.0: its fields ride along today and can be added as a superset."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from trainyard.api.meta import Int64, KubeModel, crd_field
from trainyard.api.objects import dump_object, load_yaml_documents, parse_object
from trainyard.api.trainer import TrainJobSpec

EXAMPLES = Path(__file__).parent / "examples"
V23_TRAINJOB = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "v23"},
    "spec": {
        "runtimeRef": {"name": "torch-distributed"},
        "activeDeadlineSeconds": 3600,
        "trainer": {"numNodes": 2, "numProcPerNode": 4},
        "runtimePatches": [{"manager": "kueue", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": []}}}}],
    },
    "status": {"trainerStatus": {"progressPercentage": 10}},
}


class RuntimePatch(KubeModel):
    """(Illustration) a v2.3.0 runtime patch, typed by a later issue."""

    manager: str = crd_field("Who owns the patch.", required=True)


class TrainJobSpecV23(TrainJobSpec):
    """(Illustration) the v2.3.0 additions declared as optional fields on top of v2.1.0."""

    active_deadline_seconds: Int64 | None = crd_field("Seconds before the job is failed.", minimum=1)
    runtime_patches: list[RuntimePatch] | None = crd_field("Patches to the runtime.", list_type="atomic")


def _parse_spec(model: type[KubeModel], spec: dict[str, Any]) -> dict[str, Any]:
    return model.model_validate(copy.deepcopy(spec), by_alias=True, by_name=False).model_dump()


def test_v2_3_trainjob_round_trips_with_the_v2_1_models() -> None:
    doc = copy.deepcopy(V23_TRAINJOB)
    job = parse_object(doc)
    assert dump_object(job) == V23_TRAINJOB
    assert job.spec.trainer.num_proc_per_node == 4  # v2.3.0's integer fits int-or-string
    assert job.spec.model_extra["activeDeadlineSeconds"] == 3600


def test_adding_v2_3_fields_changes_nothing_for_v2_1_manifests() -> None:
    for path in sorted(EXAMPLES.glob("trainjob-*.yaml")):
        for doc in load_yaml_documents(path.read_text(), path.name):
            assert _parse_spec(TrainJobSpecV23, doc["spec"]) == _parse_spec(TrainJobSpec, doc["spec"]) == doc["spec"]


def test_added_v2_3_fields_become_typed_and_still_round_trip() -> None:
    spec = TrainJobSpecV23.model_validate(copy.deepcopy(V23_TRAINJOB["spec"]), by_alias=True, by_name=False)
    assert spec.active_deadline_seconds == 3600
    assert spec.runtime_patches[0].manager == "kueue"
    assert spec.model_dump() == V23_TRAINJOB["spec"]
