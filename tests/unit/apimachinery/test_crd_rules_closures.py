"""CRD ``x-kubernetes-validations`` rules evaluated through closures (``CompiledRule.closures``)
give the verdicts and the error texts cel-python's interpreter gives: every rule of the shipped
CRDs, on the values the shipped runtimes, examples and planned JobSets hold at the rule's field,
on a pool of valid, invalid and wrongly-typed values, and on rule shapes whose right side of a
decided ``&&``/``||`` fails (cel-python evaluates it and fails the whole rule). The JSON-to-CEL
conversion they run on (``cel_value``) gives what cel-python's ``json_to_cel`` gives."""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Iterator

import celpy
import pytest
import yaml

from trainyard.apimachinery.cel import CelError, cel_value, compile_rule
from trainyard.pipeline import plan
from trainyard.pipeline.validation import schema_rules

REPO = Path(__file__).resolve().parents[3]
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(group, kind) -> the served version's openAPIV3Schema, for every shipped CRD."""
    out = {}
    for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=_LOADER):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                version = next(v for v in doc["spec"]["versions"] if v.get("served"))
                out[(doc["spec"]["group"], doc["spec"]["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return out


def shipped_rules() -> list[str]:
    return sorted({rule for schema in crd_schemas().values() for rule in schema_rules(schema)})


def _documents() -> Iterator[dict[str, Any]]:
    paths = sorted((REPO / "deploy" / "runtimes").glob("*.yaml")) + sorted((REPO / "examples").rglob("*.yaml"))
    for path in paths:
        for doc in yaml.load_all(path.read_text(), Loader=_LOADER):
            if isinstance(doc, dict) and isinstance(doc.get("kind"), str):
                yield doc
    runtimes = {d["metadata"]["name"]: d for d in _documents_of_kind("ClusterTrainingRuntime")}
    for name, runtime in runtimes.items():  # the JobSets trainyard applies
        job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
               "metadata": {"name": "job", "namespace": "ns", "uid": "u"}, "spec": {"runtimeRef": {"name": name}}}
        yield from plan(job, runtime).objects


def _documents_of_kind(kind: str) -> Iterator[dict[str, Any]]:
    for path in sorted((REPO / "deploy" / "runtimes").glob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=_LOADER):
            if isinstance(doc, dict) and doc.get("kind") == kind:
                yield doc


def _sites(value: Any, schema: Any) -> Iterator[tuple[str, Any]]:
    """(rule, the value at the rule's field) for every rule the document reaches."""
    if not isinstance(schema, dict):
        return
    for spec in schema.get("x-kubernetes-validations") or []:
        yield spec["rule"], value
    for branch in schema.get("allOf") or []:
        yield from _sites(value, branch)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, child in value.items():
            child_schema = props.get(key, additional if isinstance(additional, dict) else None)
            yield from _sites(child, child_schema)
    elif isinstance(value, list):
        for item in value:
            yield from _sites(item, schema.get("items"))


@functools.lru_cache(maxsize=None)
def document_values() -> dict[str, list[Any]]:
    """Per rule, the distinct values the shipped documents hold at its field."""
    found: dict[str, list[Any]] = {}
    for doc in _documents():
        schema = crd_schemas().get((doc.get("apiVersion", "").split("/")[0], doc["kind"]))
        if schema is None:
            continue
        root = dict(doc, metadata={k: v for k, v in (doc.get("metadata") or {}).items() if k == "name"})
        for rule, value in _sites(root, schema):
            if value not in found.setdefault(rule, []):
                found[rule].append(value)
    return found


# Valid, invalid and wrongly-typed values for the shipped rules' fields (each rule gets all).
POOL: list[Any] = [
    None, True, 0, 1, -3, 2.5, "", "auto", "gpu", "npu", "node", "s3://bucket/model", "hf://org/m", "no-scheme",
    [], ["node"], ["init", "node"], [1, "node"], {}, {"metadata": {"name": "ok-1"}}, {"metadata": {"name": "1Bad_"}},
    {"metadata": {"name": "x" * 70}}, {"metadata": {}}, {"metadata": {"name": 3}},
    {"templates": [{"metadata": {"namespace": "x"}}]}, {"templates": [{"metadata": {"namespace": ""}}]},
    {"templates": [{"metadata": {}}]}, {"templates": [{}]}, {"templates": "x"}, {"templates": [{"metadata": {"namespace": 1}}]},
    {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [{"name": "a", "dependsOn": [{"name": "b"}]}]},
    {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [{"name": "a"}]},
    {"startupPolicy": {"startupPolicyOrder": "AnyOrder"}, "replicatedJobs": [{"name": "a", "dependsOn": []}]},
    {"startupPolicy": {}, "replicatedJobs": [{"name": "a"}]}, {"startupPolicy": {"startupPolicyOrder": "InOrder"}},
    {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": "x"}, {"startupPolicy": "x"},
    {"torch": {}}, {"torch": {}, "mpi": {}}, {"jax": {}, "xgboost": {}, "flux": {}}, {"numNodes": 2},
    {"numNodes": 2, "torch": {"elasticPolicy": {"maxNodes": 3}}}, {"torch": {"elasticPolicy": {}}},
    {"image": "a"}, {"image": "b"}, {"image": 1}, {"lastUpdatedTime": "2026-01-01T00:00:00Z"}, {"manager": "m"},
]
OLD_POOL: list[Any] = [None, 1, "auto", "node", ["node"], {}, {"image": "a"}, {"metadata": {"name": "ok-1"}}]

# Rule shapes around the shipped ones: failures on the right of a decided ``&&``/``||`` (which
# cel-python evaluates, a failing ``map``/``filter`` there failing the rule), errors inside
# macros, overloads, non-bool results.
SHAPES = [
    "false && self.map(x, 10 / x).size() > 0", "true || self.filter(x, 10 / x > 1).size() > 0",
    "self.size() == 0 || self.map(x, 10 / x).size() > 0", "self.exists(x, x == 'node') && self.missing",
    "self.all(x, 10 / x > 1)", "self.exists_one(x, 10 / x > 1)", "self.missing || true", "self.missing && false",
    "has(self.image) && self.image.startsWith('a')", "self > 0", "self == 'auto'", "size(self) > 1", "self",
    "self.a", "self + 1 > 2", "[self].all(x, x > 0)", "int(self) > 0", "self.matches('^[a-z]+$')",
    "self == '' || self.matches('^[a-z]+://.+$')", "self.size() <= 1 ? true : self[5] == 1",
    # shapes that read part of ``self`` (the closures get only that part converted)
    "has(self.a)", "has(self.a.b)", "!has(self.a) || self.a.size() > 0", "self.a.exists(x, has(x.b))",
    "self.a.all(x, x.b == 1)", "self.exists(k, k == 'a')", "self.a.map(x, x.b).size() == 2", "(self).a == 1",
    "self.a.filter(x, has(x.b)).size() == 1", "self.a.exists_one(x, has(x.b))", "self.a.all(self, has(self.b))",
    "has(self.a) && self.a.b.c == 1", "self.a == {'b': 1}", "has(self.image) && size(self.image) > 1",
]
SHAPE_VALUES = [None, 0, 1, 5, "", "abc", "s3://b", [], [0], [1, 2], [5, 10], ["node"], {}, {"image": "abc"},
                {"image": 1}, {"a": 1}, {"a": [{"b": 1}, {"c": 2}]}, {"a": [{"b": 1}, {"b": 2 ** 64}]},
                {"a": {"b": 1}, "z": 2 ** 64}, {"a": "str"}, {"a": [1, 2]}, {"a": {"b": {"c": 1}}},
                {"a": [], "z": [1, {"y": 2 ** 63}]}, {"a": [{"b": 1}, {"b": 1, "c": [2 ** 63]}]}, {"a": {"b": 1}},
                {"image": "ab", "other": {"deep": [{"x": -(2 ** 63) - 1}]}}]


def outcome(rule: Any, value: Any, old: Any) -> tuple:
    try:
        return ("holds", rule.holds(value, old))
    except CelError as err:
        return ("error", str(err))


def interpreter_only(rule: str) -> Any:
    return dataclasses.replace(compile_rule(rule), closures=None)


def test_every_shipped_rule_runs_as_closures() -> None:
    rules = shipped_rules()
    assert len(rules) >= 14
    for rule in rules:
        compiled = compile_rule(rule)
        assert compiled.exact or compiled.closures is not None, rule


def test_the_jobset_rule_reads_part_of_the_spec() -> None:
    # JobSet writes run this rule on every create: the closures get only what it reads
    rule = next(r for r in shipped_rules() if "startupPolicyOrder" in r)
    need = compile_rule(rule).need
    assert need is not None and set(need.fields) == {"startupPolicy", "replicatedJobs"}


def test_the_documents_reach_the_rules() -> None:
    values = document_values()
    # the JobSet spec rule (every JobSet write), the runtime's policy rules and the name rules
    assert sum(1 for rule in values if compile_rule(rule).closures is not None) >= 5, sorted(values)


@pytest.mark.parametrize("rule", shipped_rules())
def test_shipped_rules_answer_as_the_interpreter(rule: str) -> None:
    fast, slow = compile_rule(rule), interpreter_only(rule)
    values = document_values().get(rule, []) + POOL
    olds = [None] if not fast.transition else OLD_POOL
    for value in values:
        for old in olds + ([value] if fast.transition else []):
            assert outcome(fast, value, old) == outcome(slow, value, old), (value, old)


@pytest.mark.parametrize("rule", SHAPES)
def test_rule_shapes_answer_as_the_interpreter(rule: str) -> None:
    fast, slow = compile_rule(rule), interpreter_only(rule)
    assert fast.closures is not None
    for value in SHAPE_VALUES:
        assert outcome(fast, value, None) == outcome(slow, value, None), value


def _converted(convert: Any, value: Any) -> tuple:
    try:
        return ("value", repr(convert(value)))  # celpy's reprs name every nested type
    except Exception as err:  # noqa: BLE001 - compared by type and text
        return ("error", type(err).__name__, str(err))


def test_json_values_convert_as_cel_python_converts_them() -> None:
    values = POOL + SHAPE_VALUES + [v for found in document_values().values() for v in found] + [
        2 ** 63, -(2 ** 63) - 1, 2 ** 63 - 1, {"a": [1, {"b": 2 ** 64}]}, -0.0, 1e300, {"k": None}, [[[]]], (1, "a"),
        {1: "a"}, {"t": True, "f": False}, "ü"]
    for value in values:
        assert _converted(cel_value, value) == _converted(celpy.json_to_cel, value), value
