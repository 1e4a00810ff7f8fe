"""Property tests: unknown data anywhere and any typed value survive parse -> dump unchanged."""
from __future__ import annotations

import copy
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.api.objects import dump_object, load_yaml_documents, parse_object

EXAMPLES = Path(__file__).parent / "examples"
BASES = [
    doc
    for name in ("trainjob-overrides.yaml", "runtime-mpi-coscheduling.yaml", "jobset-and-podgroups.yaml")
    for doc in load_yaml_documents((EXAMPLES / name).read_text(), name)
]

json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=6), children, max_size=3),
    max_leaves=8,
)
unknown_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyzXYZ_", min_size=1, max_size=12).map(lambda k: "zz" + k)


# Typed string->value maps: a new key there must hold a value of the map's type, so the
# test adds unknown fields only to objects.
MAPS = {"labels", "annotations", "nodeSelector", "limits", "requests", "data", "minResources"}


def _dict_nodes(value: object, key: str = "") -> list[dict]:
    found = []
    if isinstance(value, dict):
        if key not in MAPS:
            found.append(value)
        for child_key, child in value.items():
            found.extend(_dict_nodes(child, child_key))
    elif isinstance(value, list):
        for child in value:
            found.extend(_dict_nodes(child, key))
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_unknown_fields_anywhere_survive_a_round_trip(data: st.DataObject) -> None:
    doc = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    nodes = _dict_nodes(doc)
    for _ in range(data.draw(st.integers(1, 4))):
        node = data.draw(st.sampled_from(nodes))
        node[data.draw(unknown_keys)] = data.draw(json_values)
    expected = copy.deepcopy(doc)
    assert dump_object(parse_object(doc)) == expected


quantities = st.integers(0, 10**6) | st.floats(0, 1e6, allow_nan=False) | st.from_regex(r"\A[0-9]{1,4}(m|Ki|Mi|Gi)?\Z")
int_or_string = st.integers(-5, 64) | st.sampled_from(["auto", "cpu", "gpu", "8"])


@settings(max_examples=60, deadline=None)
@given(
    num_nodes=st.integers(-(2**31), 2**31 - 1),
    num_proc=int_or_string,
    limits=st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantities, max_size=3),
    suspend=st.booleans(),
    labels=st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=3),
)
def test_typed_trainjob_values_keep_their_type_and_value(num_nodes: int, num_proc: int | str, limits: dict, suspend: bool, labels: dict) -> None:
    doc = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "suspend": suspend,
            "labels": labels,
            "trainer": {"numNodes": num_nodes, "numProcPerNode": num_proc, "resourcesPerNode": {"limits": limits}},
        },
    }
    expected = copy.deepcopy(doc)
    dumped = dump_object(parse_object(doc))
    assert dumped == expected
    assert type(dumped["spec"]["trainer"]["numProcPerNode"]) is type(num_proc)
    assert [type(v) for v in dumped["spec"]["trainer"]["resourcesPerNode"]["limits"].values()] == [type(v) for v in limits.values()]
