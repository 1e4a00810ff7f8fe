"""One evaluator for the CRDs' rules: the devcluster API server and ``trainyard validate`` give
the same answer (fields and texts) for the same write, because both run the generated CRDs'
own schema and ``x-kubernetes-validations`` through ``trainyard.apimachinery``."""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from fixtures.pipeline_builders import container, job, runtime, trainjob
from trainyard.apimachinery.cel import compile_rule
from trainyard.pipeline import validate_runtime, validate_trainjob
from trainyard_services.devcluster.apiserver.errors import ApiError
from trainyard_services.devcluster.apiserver.registry.kinds import types_from_crd
from trainyard_services.devcluster.apiserver.registry.store import WriteOptions
from trainyard_services.devcluster.apiserver.registry.schema import SchemaProcessor

CRDS = Path(__file__).resolve().parents[3] / "deploy" / "crds"


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def _crd_documents(file_name: str) -> tuple[Any, ...]:
    return tuple(yaml.load_all((CRDS / file_name).read_text(), Loader=_LOADER))


def served(file_name: str) -> Any:
    return types_from_crd(_crd_documents(file_name)[0])[0]


def devcluster_texts(rt: Any, new: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What the devcluster answers: ``<field>: <message>`` per cause (none when stored)."""
    processor = SchemaProcessor()
    stored_old = processor.process(rt, copy.deepcopy(old), None, WriteOptions()) if old is not None else None
    try:
        processor.process(rt, copy.deepcopy(new), stored_old, WriteOptions())
    except ApiError as err:
        assert err.code == 422
        return [f"{c['field']}: {c['message']}" for c in err.details["causes"]]
    return []


def with_spec(doc: dict[str, Any], **spec: Any) -> dict[str, Any]:
    changed = copy.deepcopy(doc)
    changed["spec"].update(spec)
    return changed


def node_runtime(ml_policy: dict[str, Any] | None = None, **jobset_spec: Any) -> dict[str, Any]:
    return runtime([job("node", container("node"), ancestor="trainer")], ml_policy=ml_policy,
                   jobset_spec=jobset_spec or None)


def _patch(service_account: str) -> dict[str, Any]:
    return {"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"serviceAccountName": service_account}}}}}]}}}}


BASE = trainjob()
TRAINJOB_CASES = [
    pytest.param(with_spec(BASE, managedBy="someone/else"), None, id="managed-by-values"),
    pytest.param(with_spec(BASE, initializer={"model": {"storageUri": "no-scheme"}}), None, id="storage-uri"),
    pytest.param(with_spec(BASE, activeDeadlineSeconds=0), None, id="deadline-minimum"),
    pytest.param(trainjob(runtime_name="other"), BASE, id="runtime-ref-immutable"),
    pytest.param(with_spec(BASE, managedBy="kueue.x-k8s.io/multikueue"), BASE, id="managed-by-immutable"),
    pytest.param(with_spec(BASE, trainer={"image": "b"}), with_spec(BASE, trainer={"image": "a"}), id="trainer"),
    pytest.param(with_spec(BASE, trainer={"numNodes": 3}), with_spec(BASE, trainer={"numNodes": 1}),
                 id="num-nodes-left-to-the-webhook"),
    pytest.param(with_spec(BASE, runtimePatches=[_patch("b")]), with_spec(BASE, runtimePatches=[_patch("a")]),
                 id="runtime-patch-immutable-pod-field"),
    pytest.param(with_spec(BASE, suspend=True), BASE, id="allowed-update"),
]


@pytest.mark.parametrize("new, old", TRAINJOB_CASES)
def test_trainjob_rules_answer_the_same_in_devcluster_and_validate(new: dict, old: dict | None) -> None:
    expected = devcluster_texts(served("trainer.kubeflow.org_trainjobs.yaml"), new, old)
    result = validate_trainjob(new, old, runtime=node_runtime())
    schema_texts = result.texts() if result.code == 422 else []
    assert schema_texts == expected


RUNTIME_CASES = [
    pytest.param(node_runtime({"torch": {}, "jax": {}}), None, id="one-policy"),
    pytest.param(node_runtime({"numNodes": 2, "torch": {"elasticPolicy": {"maxNodes": 3}}}), None, id="elastic"),
    pytest.param(node_runtime({"torch": {"numProcPerNode": 0}}), None, id="nproc-zero"),
    pytest.param(node_runtime({"torch": {"numProcPerNode": "npu"}}), None, id="nproc-string"),
    pytest.param(node_runtime({"flux": {"numProcPerNode": 0}}), None, id="flux-nproc"),
    pytest.param(node_runtime({"torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["node"]}]}}}),
                 None, id="env-injection"),
    pytest.param(node_runtime(successPolicy={"operator": "Any"}), node_runtime(successPolicy={"operator": "All"}),
                 id="jobset-immutable"),
    # A rule trainyard validate never had hand-coded: now checked because the CRD has it.
    pytest.param(node_runtime(volumeClaimPolicies=[{"templates": [{"metadata": {"name": "d", "namespace": "x"}}]}]),
                 None, id="volume-claim-namespace"),
    pytest.param(node_runtime({"torch": {"numProcPerNode": "gpu"}}), None, id="allowed"),
]


@pytest.mark.parametrize("new, old", RUNTIME_CASES)
def test_runtime_rules_answer_the_same_in_devcluster_and_validate(new: dict, old: dict | None) -> None:
    expected = devcluster_texts(served("trainer.kubeflow.org_trainingruntimes.yaml"), new, old)
    result = validate_runtime(new, old)
    assert (result.texts() if result.code == 422 else []) == expected
    if "volume-claim" in str(new):
        assert expected == ['spec.template.spec.volumeClaimPolicies[0]: Invalid value: "object": namespace cannot '
                            "be set for VolumeClaimPolicies templates"]


def test_every_crd_rule_compiles_once_into_the_evaluator() -> None:
    rules = {rule["rule"] for path in CRDS.glob("*.yaml") for doc in _crd_documents(path.name)
             if doc and doc.get("kind") == "CustomResourceDefinition" for rule in _rules(doc)}
    assert len(rules) >= 14
    for rule in rules:
        compiled = compile_rule(rule)
        assert compiled.program is not None or compiled.exact, (rule, compiled.compile_error)
        assert compile_rule(rule) is compiled


def _rules(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return list(node.get("x-kubernetes-validations") or []) + [r for v in node.values() for r in _rules(v)]
    if isinstance(node, list):
        return [r for v in node for r in _rules(v)]
    return []
