"""dump_object(parse_object(doc)) == doc for every valid document we know of."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from trainyard.api.objects import dump_object, parse_object
from trainyard.api.trainer import ClusterTrainingRuntime, TrainJob

# shared/ sits beside the project checkout (as in CI).
REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference"
REPO = Path(__file__).resolve().parents[3]
V21_RUNTIMES = sorted((REFERENCE / "trainer-v2.1.0" / "runtimes").glob("*.yaml"))
V23_RUNTIMES = sorted((REFERENCE / "trainer-v2.3.0" / "runtimes").glob("*.yaml"))
SHIPPED_RUNTIMES = sorted(p for p in (REPO / "deploy" / "runtimes").glob("*.yaml") if p.name != "kustomization.yaml")
EXAMPLES = Path(__file__).parent / "examples"


def _documents(paths: list[Path]) -> list[tuple[str, dict]]:
    found = []
    for path in paths:
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                found.append((f"{path.parent.parent.name}/{path.name}#{index}", doc))
    return found


@pytest.mark.skipif(not V21_RUNTIMES, reason="reference runtimes not present")
@pytest.mark.parametrize(("name", "doc"), _documents(V21_RUNTIMES), ids=lambda v: v if isinstance(v, str) else "")
def test_v2_1_reference_runtimes_round_trip_exactly(name: str, doc: dict) -> None:
    original = copy.deepcopy(doc)
    obj = parse_object(doc, strict=True)
    assert isinstance(obj, ClusterTrainingRuntime)
    assert dump_object(obj) == original
    assert yaml.safe_dump(dump_object(obj), sort_keys=True) == yaml.safe_dump(original, sort_keys=True)


@pytest.mark.parametrize(("name", "doc"), _documents(V23_RUNTIMES + SHIPPED_RUNTIMES), ids=lambda v: v if isinstance(v, str) else "")
def test_newer_and_shipped_runtimes_round_trip_with_unmodelled_fields_kept(name: str, doc: dict) -> None:
    original = copy.deepcopy(doc)
    assert dump_object(parse_object(doc)) == original


@pytest.mark.parametrize(("name", "doc"), _documents(sorted(EXAMPLES.glob("*.yaml"))), ids=lambda v: v if isinstance(v, str) else "")
def test_trainjob_examples_round_trip_exactly(name: str, doc: dict) -> None:
    original = copy.deepcopy(doc)
    obj = parse_object(doc, strict=True)
    assert dump_object(obj) == original


def test_quantities_keep_their_written_type() -> None:
    doc = _trainjob({"trainer": {"resourcesPerNode": {"limits": {"cpu": 2, "memory": "1Gi", "nvidia.com/gpu": 1}, "requests": {"cpu": 0.5, "memory": "512Mi"}}}})
    resources = parse_object(doc).spec.trainer.resources_per_node
    assert resources.limits == {"cpu": 2, "memory": "1Gi", "nvidia.com/gpu": 1}
    assert resources.requests["cpu"] == 0.5
    assert dump_object(parse_object(doc)) == doc


@pytest.mark.parametrize("value", [4, "auto", "cpu", "gpu", "8"])
def test_num_proc_per_node_is_kept_as_written(value: int | str) -> None:
    doc = _trainjob({"trainer": {"numProcPerNode": value}})
    parsed = parse_object(doc).spec.trainer.num_proc_per_node
    assert parsed == value and type(parsed) is type(value)
    assert dump_object(parse_object(doc)) == doc


def test_unknown_fields_are_preserved_verbatim_at_every_level() -> None:
    doc = _trainjob({"activeDeadlineSeconds": 60, "runtimePatches": [{"manager": "x", "weird_key": {"a": [1, None]}}]})
    doc["spec"]["runtimeRef"]["futureField"] = True
    doc["status"] = {"trainerStatus": {"progress": "10%"}}
    doc["extraTopLevel"] = "kept"
    assert dump_object(parse_object(doc)) == doc


def test_snake_case_keys_are_not_taken_for_camel_case_fields() -> None:
    doc = _trainjob({"trainer": {"num_nodes": 3}})
    obj = parse_object(doc)
    assert obj.spec.trainer.num_nodes is None
    assert dump_object(obj) == doc


def test_explicit_nulls_and_empty_values_survive() -> None:
    doc = _trainjob({"trainer": {"image": None, "args": [], "env": []}, "labels": {}})
    assert dump_object(parse_object(doc)) == doc


def test_absent_fields_are_not_added() -> None:
    doc = _trainjob({})
    assert dump_object(parse_object(doc)) == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "job", "namespace": "default"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }


def test_unknown_kind_is_kept_whole() -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 3}, "data": [1]}
    assert dump_object(parse_object(doc)) == doc


def test_objects_built_in_python_dump_as_complete_documents() -> None:
    from trainyard.api.meta import ObjectMeta
    from trainyard.api.trainer import RuntimeRef, TrainJobSpec

    job = TrainJob(metadata=ObjectMeta(name="a"), spec=TrainJobSpec(runtime_ref=RuntimeRef(name="torch-distributed")))
    assert dump_object(job) == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "a"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }


def _trainjob(spec_extra: dict) -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "job", "namespace": "default"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec_extra},
    }


def test_plain_model_dump_is_the_wire_form_too() -> None:
    import json

    doc = _trainjob({"trainer": {"numNodes": 2}})
    job = parse_object(doc)
    assert job.model_dump() == doc
    assert json.loads(job.model_dump_json()) == doc
    assert job.model_dump(exclude_unset=False)["spec"]["suspend"] is None
