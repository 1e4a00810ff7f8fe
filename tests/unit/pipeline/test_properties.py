"""Properties of planning: determinism, idempotence, and no crash on arbitrary input."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.pipeline_builders import fixed_ssh_key
from trainyard.pipeline import PlanningError, canonical_json, plan, render_yaml, validate_trainjob
from trainyard.pipeline.documents import object_key

RUNTIMES_DIR = Path(__file__).resolve().parents[4] / "shared" / "reference" / "trainer-v2.1.0" / "runtimes"
RUNTIMES = {doc["metadata"]["name"]: doc for doc in
            (yaml.safe_load(p.read_text()) for p in sorted(RUNTIMES_DIR.glob("*.yaml")))}
# One runtime with both gang-scheduling policies, so PodGroups take part too.
GANG = copy.deepcopy(RUNTIMES["torch-distributed"])
GANG["metadata"]["name"] = "torch-gang"
GANG["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 30}, "volcano": {}}
RUNTIMES["torch-gang"] = GANG

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
env_vars = st.lists(st.fixed_dictionaries({"name": st.from_regex(r"[A-Z][A-Z_]{0,6}", fullmatch=True),
                                           "value": st.text(max_size=5)}), max_size=3, unique_by=lambda e: e["name"])
quantities = st.sampled_from(["1", "2", "500m", "2.5", 4, "1Gi", "512Mi"])
resources = st.fixed_dictionaries({}, optional={
    "limits": st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantities, max_size=2),
    "requests": st.dictionaries(st.sampled_from(["cpu", "memory", "example.com/gpu"]), quantities, max_size=2)})
trainers = st.fixed_dictionaries({}, optional={
    "numNodes": st.integers(0, 6),
    "numProcPerNode": st.one_of(st.integers(1, 8), st.sampled_from(["auto", "cpu", "gpu"])),
    "image": names,
    "command": st.one_of(st.just(["tune", "run"]), st.lists(names, min_size=1, max_size=3)),
    "args": st.lists(st.sampled_from(["model.lora_attn_modules=[q]", "model.quantize_base=True", "x=1"]),
                     max_size=2),
    "env": env_vars,
    "resourcesPerNode": resources,
})
overrides = st.lists(st.fixed_dictionaries({
    "targetJobs": st.just([{"name": "node"}]),
    "spec": st.fixed_dictionaries({}, optional={"nodeSelector": st.dictionaries(names, names, max_size=2),
                                                "serviceAccountName": names}),
}), max_size=2)


@st.composite
def trainjobs(draw: st.DrawFn) -> dict[str, Any]:
    runtime_name = draw(st.sampled_from(sorted(RUNTIMES)))
    spec: dict[str, Any] = {"runtimeRef": {"name": runtime_name}}
    spec.update(draw(st.fixed_dictionaries({}, optional={
        "trainer": trainers, "suspend": st.booleans(), "labels": st.dictionaries(names, names, max_size=2),
        "podTemplateOverrides": overrides})))
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": draw(names), "namespace": "ns", "uid": "u"}, "spec": spec}


def try_plan(trainjob: dict[str, Any], observed: Any = ()) -> Any:
    runtime = RUNTIMES[trainjob["spec"]["runtimeRef"]["name"]]
    try:
        return plan(trainjob, runtime, observed, new_ssh_key=fixed_ssh_key)
    except PlanningError:
        return None


@SETTINGS
@given(trainjobs())
def test_planning_is_deterministic(trainjob: dict[str, Any]) -> None:
    before = copy.deepcopy(trainjob)
    first, second = try_plan(trainjob), try_plan(copy.deepcopy(trainjob))
    assert trainjob == before  # planning never modifies its input
    if first is None:
        assert second is None
        return
    assert canonical_json(first.objects) == canonical_json(second.objects)
    assert render_yaml(first.objects) == render_yaml(second.objects)
    assert first.hash == second.hash


@SETTINGS
@given(trainjobs())
def test_planning_again_on_the_applied_plan_changes_nothing(trainjob: dict[str, Any]) -> None:
    first = try_plan(trainjob)
    if first is None:
        return
    again = try_plan(trainjob, first.objects)
    assert again is not None
    applied = {object_key(obj): obj for obj in first.objects}
    for obj in again.objects:
        assert applied[object_key(obj)] == obj
    assert not any(obj["kind"] == "Secret" for obj in again.objects)  # the SSH key is reused


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=4)),
                           lambda inner: st.one_of(st.lists(inner, max_size=2),
                                                   st.dictionaries(st.text(max_size=4), inner, max_size=2)),
                           max_leaves=4)


def paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += paths(value, (*prefix, index))
    return found


@st.composite
def mutated_trainjobs(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(trainjobs()))  # strategies may share objects (st.just)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(doc)[1:]))
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON_VALUES)
        if not paths(doc)[1:]:
            break
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_trainjobs())
def test_mutated_trainjobs_give_a_plan_or_field_errors(trainjob: dict[str, Any]) -> None:
    runtimes = list(RUNTIMES.values())
    result = validate_trainjob(trainjob, observed=runtimes)
    if not result.allowed:
        assert result.texts() and all(isinstance(t, str) for t in result.texts())
        return
    try:
        planned = plan(trainjob, observed=runtimes, new_ssh_key=fixed_ssh_key)
    except PlanningError as err:
        assert err.message
        return
    assert planned.objects


@st.composite
def mutated_runtimes(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(RUNTIMES[draw(st.sampled_from(sorted(RUNTIMES)))])
    for _ in range(draw(st.integers(1, 3))):
        candidates = paths(doc)[1:]
        path = draw(st.sampled_from(candidates))
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON_VALUES)
        if not paths(doc)[1:]:
            break
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_runtimes(), trainjobs())
def test_mutated_runtimes_give_a_plan_or_errors(runtime: dict[str, Any], trainjob: dict[str, Any]) -> None:
    from trainyard.pipeline import validate_runtime

    if not validate_runtime(runtime).allowed:
        return
    name = (runtime.get("metadata") or {}).get("name") if isinstance(runtime.get("metadata"), dict) else None
    if not isinstance(name, str) or runtime.get("kind") not in ("ClusterTrainingRuntime", "TrainingRuntime"):
        return
    trainjob["spec"]["runtimeRef"] = {"name": name, "kind": runtime["kind"]}
    if runtime["kind"] == "TrainingRuntime":
        runtime["metadata"]["namespace"] = "ns"
    result = validate_trainjob(trainjob, observed=[runtime])
    if not result.allowed:
        return
    try:
        plan(trainjob, observed=[runtime], new_ssh_key=fixed_ssh_key)
    except PlanningError as err:
        assert err.message
