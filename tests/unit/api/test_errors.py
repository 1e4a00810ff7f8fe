"""Bad input gives one line per problem, naming the JSON path with wire names."""
from __future__ import annotations

import pytest

from trainyard.api.objects import FieldError, load_yaml_documents, parse_object, parse_yaml


def _trainjob(spec: dict) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"}, "spec": spec}


def _runtime(spec: dict) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime", "metadata": {"name": "r"}, "spec": spec}


def _errors(doc: dict, strict: bool = False) -> list[str]:
    with pytest.raises(FieldError) as caught:
        parse_object(doc, strict=strict)
    return caught.value.errors


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            _trainjob({"runtimeRef": {"name": "t"}, "trainer": {"numNodes": "two"}}),
            "spec.trainer.numNodes: Input should be a valid integer",
        ),
        (
            _trainjob({"runtimeRef": {"name": "t"}, "trainer": {"numNodes": "2"}}),
            "spec.trainer.numNodes: Input should be a valid integer",
        ),
        (
            _trainjob({"runtimeRef": {"name": "t"}, "suspend": "yes"}),
            "spec.suspend: Input should be a valid boolean",
        ),
        (
            _trainjob({"runtimeRef": {"name": "t"}, "trainer": {"numProcPerNode": [2]}}),
            "spec.trainer.numProcPerNode: Input should be an integer or a string",
        ),
        (
            _trainjob({"runtimeRef": {"name": "t"}, "trainer": {"resourcesPerNode": {"limits": {"cpu": [1]}}}}),
            "spec.trainer.resourcesPerNode.limits.cpu: Input should be a quantity (a number or a string like 1Gi)",
        ),
        (
            _trainjob({"runtimeRef": {"name": "t"}, "trainer": {"command": "python train.py"}}),
            "spec.trainer.command: Input should be a valid list",
        ),
        (
            _trainjob({"runtimeRef": {"name": "t"}, "labels": {"a": 1}}),
            "spec.labels.a: Input should be a valid string",
        ),
    ],
    ids=["int-from-word", "int-from-numeric-string", "bool", "int-or-string", "quantity", "list", "map-value"],
)
def test_wrong_type_names_the_path(doc: dict, expected: str) -> None:
    assert _errors(doc) == [expected]


def test_missing_required_fields_name_the_path() -> None:
    assert _errors(_trainjob({})) == ["spec.runtimeRef: Field required"]
    assert _errors(_trainjob({"runtimeRef": {}})) == ["spec.runtimeRef.name: Field required"]
    doc = _trainjob({"runtimeRef": {"name": "t"}, "podTemplateOverrides": [{"targetJobs": [{"name": "node"}]}, {"spec": {}}]})
    assert _errors(doc) == ["spec.podTemplateOverrides[1].targetJobs: Field required"]
    doc = _trainjob({"runtimeRef": {"name": "t"}, "trainer": {"env": [{"value": "x"}]}})
    assert _errors(doc) == ["spec.trainer.env[0].name: Field required"]


def test_invalid_enums_name_the_path_and_the_allowed_values() -> None:
    doc = _runtime({"mlPolicy": {"mpi": {"mpiImplementation": "MPICH"}}})
    assert _errors(doc) == ["spec.mlPolicy.mpi.mpiImplementation: Input should be 'OpenMPI' or ''"]
    doc = _runtime({"template": {"spec": {"successPolicy": {"operator": "Some"}}}})
    assert _errors(doc) == ["spec.template.spec.successPolicy.operator: Input should be 'All' or 'Any'"]
    doc = _runtime({"podGroupPolicy": {"volcano": {"networkTopology": {"mode": "strict"}}}})
    assert _errors(doc) == ["spec.podGroupPolicy.volcano.networkTopology.mode: Input should be 'hard' or 'soft'"]


def test_several_problems_are_all_reported() -> None:
    doc = _trainjob({"runtimeRef": {"name": 5}, "trainer": {"numNodes": True, "image": 3}})
    assert sorted(_errors(doc)) == [
        "spec.runtimeRef.name: Input should be a valid string",
        "spec.trainer.image: Input should be a valid string",
        "spec.trainer.numNodes: Input should be a valid integer",
    ]


def test_unknown_fields_are_kept_by_default_and_rejected_in_strict_mode() -> None:
    doc = _trainjob({"runtimeRef": {"name": "t", "nmae": "x"}, "trainer": {"numNodes": 1, "gpus": 2}})
    parse_object(doc)  # lenient: preserved for a lossless round trip
    assert _errors(doc, strict=True) == [
        "spec.runtimeRef.nmae: Extra inputs are not permitted",
        "spec.trainer.gpus: Extra inputs are not permitted",
    ]


def test_strict_mode_checks_built_in_kubernetes_types_against_their_definitions() -> None:
    container = {"name": "node", "image": "i", "securityContext": {"runAsUser": 1000, "runAsUserr": 1}, "livenessProbe": {"exec": {"command": ["true"]}}}
    doc = _runtime({"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {"containers": [container]}}}}}]}}})
    prefix = "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers[0]"
    assert _errors(doc, strict=True) == [f"{prefix}.securityContext.runAsUserr: Extra inputs are not permitted"]


def test_strict_mode_accepts_every_documented_field() -> None:
    doc = _trainjob({"runtimeRef": {"name": "t"}, "trainer": {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}})
    parse_object(doc, strict=True)


def test_documents_that_are_not_objects_are_rejected_with_a_reason() -> None:
    with pytest.raises(FieldError, match=r"\(document\): expected a mapping, got list"):
        parse_object([1, 2])
    with pytest.raises(FieldError) as caught:
        parse_object({"metadata": {}})
    assert caught.value.errors == ["apiVersion: Field required", "kind: Field required"]


def test_yaml_errors_name_the_file_and_line() -> None:
    with pytest.raises(FieldError) as caught:
        load_yaml_documents("a: 1\nb: [unclosed\n", "job.yaml")
    assert str(caught.value).startswith("job.yaml: line ")
    with pytest.raises(FieldError, match="job.yaml: document 2: expected a mapping, got str"):
        load_yaml_documents("a: 1\n---\njust text\n", "job.yaml")


def test_errors_in_a_later_document_name_it() -> None:
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n" \
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: b}\nspec: {runtimeRef: {}}\n"
    with pytest.raises(FieldError) as caught:
        parse_yaml(text, "all.yaml")
    assert str(caught.value) == "all.yaml (document 2): spec.runtimeRef.name: Field required"


def test_a_section_of_the_wrong_shape_is_named_in_json_terms() -> None:
    assert _errors(_trainjob("x")) == ["spec: Input should be an object"]  # type: ignore[arg-type]
    assert _errors(_trainjob({"runtimeRef": {"name": "t"}, "labels": ["a"]})) == ["spec.labels: Input should be an object"]


def test_yaml_timestamps_stay_strings_as_in_kubernetes() -> None:
    text = (
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n"
        "metadata: {name: j, creationTimestamp: 2025-11-07T10:00:00Z}\nspec: {runtimeRef: {name: t}}\n"
    )
    (job,) = parse_yaml(text, "job.yaml")
    assert job.metadata.creation_timestamp == "2025-11-07T10:00:00Z"


def test_strict_mode_checks_untyped_parts_of_built_in_types() -> None:
    pod = {"containers": [{"name": "c", "resources": {"claims": [{"name": "x", "nope": 1}]}}], "affinity": {"nodeAffinity": {"bad": 1}}}
    doc = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "a", "managedFields": [{"manager": "m", "bogus": 1}]},
        "spec": {"replicatedJobs": [{"name": "a", "template": {"spec": {"template": {"spec": pod}}}}]},
    }
    pod_path = "spec.replicatedJobs[0].template.spec.template.spec"
    assert _errors(doc, strict=True) == [
        "metadata.managedFields[0].bogus: Extra inputs are not permitted",
        f"{pod_path}.containers[0].resources.claims[0].nope: Extra inputs are not permitted",
        f"{pod_path}.affinity.nodeAffinity.bad: Extra inputs are not permitted",
    ]
