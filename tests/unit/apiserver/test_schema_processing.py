"""Custom-resource schema processing of the devcluster: pruning, defaults, validation, CEL rules."""
from __future__ import annotations

from pathlib import Path

import celpy
import pytest
import yaml

from trainyard_services.devcluster.apiserver.errors import ApiError
from trainyard_services.devcluster.apiserver.registry.kinds import types_from_crd
from trainyard_services.devcluster.apiserver.registry.store import WriteOptions
from trainyard.apimachinery.cel import CelError, compile_rule
from trainyard_services.devcluster.apiserver.registry.schema import SchemaProcessor

REPO = Path(__file__).resolve().parents[3]
CRD_DIR = REPO / "deploy" / "crds"


@pytest.fixture(scope="module")
def trainjobs():
    return types_from_crd(yaml.safe_load((CRD_DIR / "trainer.kubeflow.org_trainjobs.yaml").read_text()))[0]


def job(name: str = "job", **spec) -> dict:
    body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": "torch-distributed"}}}
    body["spec"].update(spec)
    return body


def test_defaults_from_the_crd_schema_are_applied(trainjobs):
    out = SchemaProcessor().process(trainjobs, job(), None, WriteOptions())
    assert out["spec"]["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                         "kind": "ClusterTrainingRuntime"}
    assert out["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"


def test_unknown_fields_strict_warn_ignore(trainjobs):
    body = job(bogus=1)
    with pytest.raises(ApiError) as caught:
        SchemaProcessor().process(trainjobs, body, None, WriteOptions(field_validation="Strict"))
    assert caught.value.code == 400 and caught.value.message == 'strict decoding error: unknown field "spec.bogus"'
    opts = WriteOptions(field_validation="Warn")
    out = SchemaProcessor().process(trainjobs, job(bogus=1), None, opts)
    assert "bogus" not in out["spec"] and opts.warnings == ['unknown field "spec.bogus"']
    quiet = WriteOptions(field_validation="Ignore")
    SchemaProcessor().process(trainjobs, job(bogus=1), None, quiet)
    assert quiet.warnings == []


def test_type_and_required_errors_name_their_fields(trainjobs):
    with pytest.raises(ApiError) as caught:
        SchemaProcessor().process(trainjobs, job(trainer={"numNodes": "two"}), None, WriteOptions())
    err = caught.value
    assert err.code == 422 and err.reason == "Invalid"
    assert err.details["causes"][0]["field"] == "spec.trainer.numNodes"
    assert err.details["causes"][0]["reason"] == "FieldValueTypeInvalid"
    body = job()
    del body["spec"]["runtimeRef"]
    with pytest.raises(ApiError) as caught:
        SchemaProcessor().process(trainjobs, body, None, WriteOptions())
    assert caught.value.message == 'TrainJob.trainer.kubeflow.org "job" is invalid: spec.runtimeRef: Required value'


def test_cel_rules_name_and_immutability(trainjobs):
    with pytest.raises(ApiError) as caught:
        SchemaProcessor().process(trainjobs, job(name="1abc"), None, WriteOptions())
    assert "RFC 1035" in caught.value.message
    old = SchemaProcessor().process(trainjobs, job(), None, WriteOptions())
    changed = job(runtimeRef={"name": "other"})
    with pytest.raises(ApiError) as caught:
        SchemaProcessor().process(trainjobs, changed, old, WriteOptions())
    assert caught.value.details["causes"][0]["field"] == "spec.runtimeRef"
    assert "immutable" in caught.value.message


def _patch(manager: str, service_account: str) -> dict:
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"serviceAccountName": service_account}}}}}]}}}}


def test_transition_rules_in_map_lists_compare_items_with_the_same_key(trainjobs):
    """v2.3.0's runtimePatches: items correlate by manager (and replicated jobs by name), as the
    API server does, not by position."""
    old = SchemaProcessor().process(trainjobs, job(runtimePatches=[_patch("a.io/x", "sa-1")]), None, WriteOptions())
    # Another manager's patch in front of it: nothing changed for a.io/x.
    reordered = job(runtimePatches=[_patch("b.io/y", "sa-9"), _patch("a.io/x", "sa-1")])
    SchemaProcessor().process(trainjobs, reordered, old, WriteOptions())
    # The same manager changing an immutable pod field is refused, at the new item's index.
    changed = job(runtimePatches=[_patch("b.io/y", "sa-9"), _patch("a.io/x", "sa-2")])
    with pytest.raises(ApiError) as caught:
        SchemaProcessor().process(trainjobs, changed, old, WriteOptions())
    assert [c["field"] for c in caught.value.details["causes"]] == [
        "spec.runtimePatches[1].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec"
        ".serviceAccountName"]
    assert "field is immutable" in caught.value.message


@pytest.mark.parametrize("rule, values", [
    ("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
     [{"metadata": {"name": "ok-1"}}, {"metadata": {"name": "1bad"}}, {"metadata": {"name": "bad-"}}]),
    ("size(self.metadata.name) <= 5", [{"metadata": {"name": "abcde"}}, {"metadata": {"name": "abcdef"}}]),
    ("self in ['a', 'b']", ["a", "b", "c"]),
    ("self > 0 || self in ['auto', 'cpu', 'gpu']", [1, 0, -3, "auto", "gpu"]),
    ("!(has(self.numNodes) && (has(self.torch) && has(self.torch.elasticPolicy)))",
     [{}, {"numNodes": 1}, {"numNodes": 1, "torch": {}}, {"numNodes": 1, "torch": {"elasticPolicy": {}}},
      {"torch": {"elasticPolicy": {}}}]),
    ("!(has(self.torch) && has(self.mpi))", [{"torch": {}}, {"torch": {}, "mpi": {}}, {}]),
])
def test_native_rule_fast_paths_agree_with_cel(rule, values):
    compiled = compile_rule(rule)
    assert compiled.native is not None and compiled.program is not None
    for value in values:
        try:
            expected = bool(compiled.program({"self": celpy.json_to_cel(value)}))
        except celpy.CELEvalError:
            expected = False  # an evaluation error fails the rule (the server re-runs CEL for its message)
        assert compiled.native(value, None) == expected, value
        try:
            assert compiled.holds(value) == expected, value
        except CelError:
            assert not expected


JOBSET_EXCLUSIVE = ("!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' "
                    "&& self.replicatedJobs.exists(x, has(x.dependsOn)))")


def test_a_negated_conjunction_holds_natively_only_when_a_known_term_is_false():
    """JobSet's StartupPolicy/DependsOn rule, on every JobSet write: ``has()`` of an absent key
    or a string field with another text makes the ``&&`` false whatever the macro gives, so
    the rule holds without CEL; in every other case CEL answers (the verdict is CEL's)."""
    compiled = compile_rule(JOBSET_EXCLUSIVE)
    assert compiled.native is not None
    depends = [{"name": "b", "dependsOn": [{"name": "a", "status": "Ready"}]}]
    certain = [{"replicatedJobs": depends},  # no startupPolicy
               {"startupPolicy": {"startupPolicyOrder": "AnyOrder"}, "replicatedJobs": depends},
               {"startupPolicy": {"startupPolicyOrder": "AnyOrder"}}]  # the macro would fail: still false
    left_to_cel = [({"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": depends}, False),
                   ({"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [{"name": "a"}]}, True),
                   ({"startupPolicy": {}, "replicatedJobs": depends}, False)]  # no such key: not certain
    for value in certain:
        assert bool(compiled.program({"self": celpy.json_to_cel(value)})) is True, value
        assert compiled.native(value, None) is True, value
        assert compiled.holds(value) is True, value
    for value, verdict in left_to_cel:
        assert compiled.native(value, None) is False, value
        try:
            assert compiled.holds(value) is verdict, value
        except CelError:
            assert not verdict


@pytest.mark.parametrize("rule", [
    "!(has(self.a) && self.b == 'x' || self.c.exists(x, x))",  # a top-level || is not a conjunction
    "!(has(self.a) && self.b == 'x') && self.c.exists(x, x)",  # the ! does not enclose it all
    "!(size(self.a) > 1 && self.c.exists(x, x))",  # no term known natively
])
def test_rules_near_the_negated_conjunction_shape_use_cel(rule):
    assert compile_rule(rule).native is None


def test_rules_outside_the_fast_shapes_use_cel():
    compiled = compile_rule("self.templates.all(t, !has(t.metadata.namespace))")
    assert compiled.native is None
    assert compiled.holds({"templates": [{"metadata": {}}]}) is True
    assert compiled.holds({"templates": [{"metadata": {"namespace": "x"}}]}) is False


def test_rules_are_compiled_once():
    assert compile_rule("size(self) <= 3") is compile_rule("size(self) <= 3")


def test_self_equals_old_self_is_exact_without_cel():
    compiled = compile_rule("self == oldSelf")
    assert compiled.transition and compiled.program is None
    assert compiled.holds({"a": [1, 2]}, {"a": [1, 2]}) is True
    assert compiled.holds("x", 1) is False  # different JSON types: not equal, not an evaluation error
