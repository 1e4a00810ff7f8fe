"""The CRDs generated from the models: coverage of upstream, structure, freshness, rules."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml

from trainyard.api.crds import crd_file_names, generate_crds
from trainyard.cli.crds import render
from trainyard.errors import UserError

REPO = Path(__file__).resolve().parents[3]
# shared/ sits beside the project checkout (as in CI).
REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference"
UPSTREAM = {
    "trainer.kubeflow.org_trainjobs.yaml": REFERENCE / "trainer-v2.1.0/crds/trainer.kubeflow.org_trainjobs.yaml",
    "trainer.kubeflow.org_trainingruntimes.yaml": REFERENCE / "trainer-v2.1.0/crds/trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer.kubeflow.org_clustertrainingruntimes.yaml": REFERENCE / "trainer-v2.1.0/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "jobset.x-k8s.io_jobsets.yaml": REFERENCE / "jobset/jobset.x-k8s.io_jobsets.yaml",
    "scheduling.x-k8s.io_podgroups.yaml": REFERENCE / "podgroups/scheduling.x-k8s.io_podgroups.yaml",
    "scheduling.volcano.sh_podgroups.yaml": REFERENCE / "podgroups/scheduling.volcano.sh_podgroups.yaml",
    "scheduling.volcano.sh_queues.yaml": REFERENCE / "podgroups/scheduling.volcano.sh_queues.yaml",
}
# trainyard is a superset of v2.1.0 and v2.3.0: the trainer CRDs are compared with both.
_V23 = REFERENCE / "trainer-v2.3.0/crds"
UPSTREAM_V23 = {name: _V23 / name for name in (
    "trainer.kubeflow.org_trainjobs.yaml", "trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer.kubeflow.org_clustertrainingruntimes.yaml")}
REFERENCES = [("v2.1.0", name, path) for name, path in sorted(UPSTREAM.items())] + \
    [("v2.3.0", name, path) for name, path in sorted(UPSTREAM_V23.items())]
_IDS = [f"{release}:{name}" for release, name, _ in REFERENCES]
# Rules that differ from one release on purpose (docs/compatibility.md, v2.3 rows). There, each
# upstream rule must still be in ours by its rule text or by its message.
RULE_CHOICES = {
    ("v2.1.0", ".spec.mlPolicy"): "v2.3.0's one-policy rule (all five sources) replaces v2.1.0's",
    ("v2.3.0", ".spec.mlPolicy"): "v2.1.0's numNodes/elasticPolicy rule is kept beside it",
    ("v2.3.0", ".spec.trainer"): "immutable except numNodes (the webhook guards numNodes)",
}
# int-or-string, a superset of v2.3.0's int32 (v2.1.0 manifests use "auto").
TYPE_CHOICES = {("v2.3.0", ".spec.trainer.numProcPerNode")}
MIN_COVERAGE = 99.0
EXAMPLES = REPO / "tests/unit/api/examples"


@functools.cache
def generated() -> dict[str, dict[str, Any]]:
    return crd_file_names()


@functools.cache
def generated_at(release: str) -> dict[str, dict[str, Any]]:
    """The CRDs as each compatibility level installs them: v2.3.0's rule messages by default,
    v2.1.0's under --trainer-compat v2.1 (docs/compatibility.md A7)."""
    from trainyard.api.crds import crds_at
    from trainyard.compat import TrainerCompat

    level = TrainerCompat.V2_1 if release == "v2.1.0" else TrainerCompat.V2_3
    by_name = {crd["metadata"]["name"]: crd for crd in crds_at(level)}
    return {file_name: by_name[crd["metadata"]["name"]] for file_name, crd in generated().items()}


@functools.cache
def upstream(file_name: str, release: str = "v2.1.0") -> dict[str, Any]:
    path = UPSTREAM_V23[file_name] if release == "v2.3.0" else UPSTREAM[file_name]
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its property path (``.spec.trainer.env[].name``; ``{}`` for map values)."""
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from schema_nodes(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize(("release", "file_name", "reference"), REFERENCES, ids=_IDS)
def test_every_upstream_property_path_exists_in_the_generated_crd(release: str, file_name: str, reference: Path) -> None:
    if not reference.exists():
        pytest.skip(f"{reference} is not present")
    theirs = {path for path, _ in schema_nodes(schema_of(upstream(file_name, release)))}
    ours = {path for path, _ in schema_nodes(schema_of(generated()[file_name]))}
    missing = sorted(theirs - ours)
    coverage = 100.0 * (len(theirs) - len(missing)) / len(theirs)
    print(f"\n{release} {file_name}: schema-path coverage {coverage:.2f}% ({len(theirs) - len(missing)}/{len(theirs)} upstream paths)")
    assert coverage >= MIN_COVERAGE, f"coverage {coverage:.2f}% < {MIN_COVERAGE}%; missing e.g. {missing[:10]}"


@pytest.mark.parametrize(("release", "file_name", "reference"), REFERENCES, ids=_IDS)
def test_names_scope_and_status_subresource_match_upstream(release: str, file_name: str, reference: Path) -> None:
    if not reference.exists():
        pytest.skip(f"{reference} is not present")
    theirs, ours = upstream(file_name, release), generated()[file_name]
    assert ours["metadata"]["name"] == theirs["metadata"]["name"]
    assert ours["spec"]["group"] == theirs["spec"]["group"]
    assert ours["spec"]["scope"] == theirs["spec"]["scope"]
    for key in ("kind", "listKind", "plural", "singular", "shortNames"):
        assert ours["spec"]["names"].get(key) == theirs["spec"]["names"].get(key)
    (their_version,), (our_version,) = theirs["spec"]["versions"], ours["spec"]["versions"]
    assert our_version["name"] == their_version["name"]
    assert bool(our_version.get("subresources", {}).get("status") is not None) == bool(
        their_version.get("subresources", {}).get("status") is not None
    )
    # Upstream's printer columns are all there (same name, path and type); ours may add more.
    our_columns = {(c["name"], c["jsonPath"], c["type"]) for c in our_version.get("additionalPrinterColumns", [])}
    for column in their_version.get("additionalPrinterColumns", []):
        assert (column["name"], column["jsonPath"], column["type"]) in our_columns


@pytest.mark.parametrize(("release", "file_name", "reference"), REFERENCES, ids=_IDS)
def test_upstream_defaults_enums_rules_and_list_types_are_kept(release: str, file_name: str, reference: Path) -> None:
    """Where upstream has a default, CEL rule, list type or map keys, ours has the same
    (v2.3.0's length and item limits too), but for the documented choices."""
    if not reference.exists():
        pytest.skip(f"{reference} is not present")
    ours = dict(schema_nodes(schema_of(generated_at(release)[file_name])))
    differences = []
    keys = ("default", "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
            "x-kubernetes-int-or-string", "type")
    if release == "v2.3.0":
        keys += ("maxLength", "minLength", "maxItems", "minItems", "minimum", "maximum")
    for path, node in schema_nodes(schema_of(upstream(file_name, release))):
        if path not in ours:
            continue
        if (release, path) in RULE_CHOICES:
            mine = ours[path].get("x-kubernetes-validations", [])
            for rule in node.get("x-kubernetes-validations", []):
                if not any(rule["rule"] == r["rule"] or rule["message"] == r["message"] for r in mine):
                    differences.append(f"{path}: upstream rule {rule!r} has no counterpart in {mine!r}")
        for key in keys:
            if key == "x-kubernetes-validations" and (release, path) in RULE_CHOICES:
                continue
            if key == "type" and (release, path) in TYPE_CHOICES:
                continue
            if key in node and node[key] != ours[path].get(key):
                differences.append(f"{path} {key}: upstream {node[key]!r}, ours {ours[path].get(key)!r}")
        # Enums may only grow (trainer embeds an older JobSet API than the one we model).
        if "enum" in node and not set(node["enum"]) <= set(ours[path].get("enum", [])):
            differences.append(f"{path} enum: upstream {node['enum']!r}, ours {ours[path].get('enum')!r}")
    assert differences == []


def test_trainer_printer_columns_include_state_and_runtime() -> None:
    columns = generated()["trainer.kubeflow.org_trainjobs.yaml"]["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns] == ["State", "Status", "Runtime", "Progress", "Suspended", "Cluster", "Age"]
    assert columns[0]["jsonPath"] == ".status.conditions[-1:].type"
    assert columns[1]["jsonPath"] == ".status.state"
    assert columns[2]["jsonPath"] == ".spec.runtimeRef.name"


def test_cel_rules_carry_upstream_messages() -> None:
    schema = schema_of(generated()["trainer.kubeflow.org_trainjobs.yaml"])
    messages = {rule["message"] for _, node in schema_nodes(schema) for rule in node.get("x-kubernetes-validations", [])}
    assert messages == {
        "metadata.name must match RFC 1035 DNS label format",
        "metadata.name must be no more than 63 characters",
        "ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set",
        # v2.3.0 (v2.1.0's "runtimeRef is immutable" and "ManagedBy value is immutable" under
        # --trainer-compat v2.1: test_upstream_defaults_enums_rules_and_list_types_are_kept)
        "field is immutable",
        "storageUri may be empty, or it must be a valid URI (scheme://...)",
        "lastUpdatedTime is required when trainerStatus is present",
    }
    runtime = dict(schema_nodes(schema_of(generated()["trainer.kubeflow.org_clustertrainingruntimes.yaml"])))
    assert [r["message"] for r in runtime[".spec.mlPolicy"]["x-kubernetes-validations"]] == [
        "numNodes should not be set if torch.elasticPolicy is configured",
        "Only one of the policy can be configured",
    ]
    assert runtime[".spec.mlPolicy.torch.numProcPerNode"]["x-kubernetes-validations"] == [
        {"message": "NumProcPerNode must be equal to auto, cpu, gpu, or int value", "rule": "self > 0 || self in ['auto', 'cpu', 'gpu']"}
    ]
    assert runtime[".spec.template.spec"]["x-kubernetes-validations"][0]["message"] == "StartupPolicy and DependsOn APIs are mutually exclusive"


# --- structural schema rules ------------------------------------------------------------------


def structural_problems(schema: dict[str, Any]) -> list[str]:
    problems = []
    for path, node in schema_nodes(schema):
        where = path or "(root)"
        if "$ref" in node or "nullable" in node or "oneOf" in node or "allOf" in node:
            problems.append(f"{where}: $ref/nullable/oneOf/allOf")
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        if "type" not in node and not int_or_string and not node.get("x-kubernetes-preserve-unknown-fields"):
            problems.append(f"{where}: no type")
        if "anyOf" in node and not (int_or_string and node["anyOf"] == [{"type": "integer"}, {"type": "string"}]):
            problems.append(f"{where}: anyOf other than int-or-string")
        if node.get("type") == "array" and not isinstance(node.get("items"), dict):
            problems.append(f"{where}: array without items")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{where}: both properties and additionalProperties")
        for key in node.get("required", []):
            if key not in node.get("properties", {}):
                problems.append(f"{where}: required {key} is not a property")
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node.get("x-kubernetes-list-map-keys", []):
                if key not in item.get("required", []) and "default" not in item["properties"].get(key, {}):
                    problems.append(f"{where}: list-map key {key} neither required nor defaulted")
        if "default" in node and "enum" in node and node["default"] not in node["enum"]:
            problems.append(f"{where}: default not in enum")
    root = schema
    if set(root["properties"]["metadata"]) != {"type"}:
        problems.append("metadata at the root must be a bare object")
    return problems


@pytest.mark.parametrize("file_name", sorted(crd_file_names()))
def test_generated_crds_are_structural_and_valid_kubernetes_objects(file_name: str) -> None:
    crd = generated()[file_name]
    assert structural_problems(schema_of(crd)) == []
    kubernetes_validate.validate(crd, "1.36.0", strict=True)


def test_deploy_crds_match_a_fresh_generation() -> None:
    stale = [name for name, crd in generated().items() if not (REPO / "deploy/crds" / name).exists() or (REPO / "deploy/crds" / name).read_text() != render(crd)]
    assert stale == [], f"deploy/crds is stale for {stale}: run `trainyard crds --out deploy/crds`"


# --- the schemas accept what upstream accepts and reject what it rejects ----------------------------


@functools.cache
def _validator(file_name: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(json.dumps(schema_of(generated()[file_name]))))


def _examples() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")) + sorted((REFERENCE / "trainer-v2.1.0/runtimes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] in {"TrainJob", "TrainingRuntime", "ClusterTrainingRuntime", "JobSet", "PodGroup"}:
                found.append((path.name, doc))
    return found


_FILES = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer.kubeflow.org_trainingruntimes.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "scheduling.x-k8s.io_podgroups.yaml",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "scheduling.volcano.sh_podgroups.yaml",
}


@pytest.mark.parametrize(("name", "doc"), _examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_valid_documents_pass_the_generated_schema(name: str, doc: dict) -> None:
    validator = _validator(_FILES[(doc["apiVersion"], doc["kind"])])
    assert [e.message for e in validator.iter_errors(doc)] == []


@pytest.mark.parametrize(
    ("spec", "bad_path"),
    [
        ({"runtimeRef": {"name": ""}}, ["spec", "runtimeRef", "name"]),
        ({}, ["spec"]),
        ({"runtimeRef": {"name": "t"}, "trainer": {"numNodes": "2"}}, ["spec", "trainer", "numNodes"]),
        ({"runtimeRef": {"name": "t"}, "trainer": {"resourcesPerNode": {"limits": {"cpu": "two"}}}}, ["spec", "trainer", "resourcesPerNode", "limits", "cpu"]),
        ({"runtimeRef": {"name": "t"}, "podTemplateOverrides": [{"spec": {}}]}, ["spec", "podTemplateOverrides", 0]),
    ],
)
def test_invalid_trainjobs_fail_the_generated_schema(spec: dict, bad_path: list) -> None:
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"}, "spec": spec}
    errors = list(_validator("trainer.kubeflow.org_trainjobs.yaml").iter_errors(doc))
    assert [list(e.absolute_path) for e in errors] == [bad_path]


# --- the command ------------------------------------------------------------------------------------


def _crds_command(*argv: str) -> int:
    """Run the ``crds`` command module in-process (as ``trainyard crds`` does)."""
    import argparse

    from trainyard.cli import crds

    parser = argparse.ArgumentParser()
    crds.configure(parser)
    return crds.run(parser.parse_args(argv))


def test_crds_command_writes_files_and_checks_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "crds"
    assert _crds_command("--out", str(out)) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(crd_file_names())
    assert _crds_command("--out", str(out), "--check") == 0
    (out / "jobset.x-k8s.io_jobsets.yaml").write_text("stale\n")
    capsys.readouterr()
    assert _crds_command("--out", str(out), "--check") == 1
    assert "jobset.x-k8s.io_jobsets.yaml: differs from a fresh generation" in capsys.readouterr().err


def test_crds_command_prints_every_crd_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert _crds_command() == 0
    printed = capsys.readouterr().out
    names = [doc["metadata"]["name"] for doc in yaml.load_all(printed, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))]
    assert names == [crd["metadata"]["name"] for crd in generate_crds()]


def test_crds_command_rejects_bad_arguments_with_a_user_error(tmp_path: Path) -> None:

    with pytest.raises(UserError, match="--check needs --out DIR"):
        _crds_command("--check")
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(UserError, match="is not a directory"):
        _crds_command("--out", str(file))


def test_trainyard_crds_prints_bad_arguments_in_one_line(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    result = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "crds", "--out", str(file)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: --out: {file} is not a directory"


# --- CEL rules compile and mean what upstream means ---------------------------------------------


def _rules_at(file_name: str, path: str) -> list[str]:
    return [r["rule"] for r in dict(schema_nodes(schema_of(generated()[file_name])))[path]["x-kubernetes-validations"]]


def _cel_accepts(rule: str, value: Any, old: Any = None) -> bool:
    """True when the rule holds; a CEL evaluation error counts as a rejection (as in Kubernetes).
    Transition rules (``oldSelf``) hold trivially without an old value, as on create."""
    import celpy

    env = celpy.Environment()
    activation = {"self": celpy.json_to_cel(value)}
    if "oldSelf" in rule:
        if old is None:
            return True
        activation["oldSelf"] = celpy.json_to_cel(old)
    try:
        return bool(env.program(env.compile(rule)).evaluate(activation))
    except Exception:  # noqa: BLE001 - CEL type errors reject the object
        return False


def test_every_cel_rule_compiles() -> None:
    import celpy

    env = celpy.Environment()
    rules = {
        rule["rule"]
        for crd in generate_crds()
        for _, node in schema_nodes(schema_of(crd))
        for rule in node.get("x-kubernetes-validations", [])
    }
    assert len(rules) >= 9
    for rule in rules:
        env.compile(rule)


@pytest.mark.parametrize(
    ("path", "value", "accepted"),
    [
        (".spec.mlPolicy", {"torch": {}, "mpi": {}}, False),
        (".spec.mlPolicy", {"torch": {}}, True),
        (".spec.mlPolicy", {"numNodes": 2, "torch": {"elasticPolicy": {}}}, False),
        (".spec.mlPolicy", {"numNodes": 2, "torch": {}}, True),
        (".spec.mlPolicy.torch.numProcPerNode", 4, True),
        (".spec.mlPolicy.torch.numProcPerNode", "gpu", True),
        (".spec.mlPolicy.torch.numProcPerNode", 0, False),
        (".spec.mlPolicy.torch.numProcPerNode", "tpu", False),
        (".spec.template.spec", {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [{"name": "a", "dependsOn": []}]}, False),
        (".spec.template.spec", {"startupPolicy": {"startupPolicyOrder": "AnyOrder"}, "replicatedJobs": [{"name": "a", "dependsOn": []}]}, True),
        # v2.3.0
        (".spec.mlPolicy", {"jax": {}, "xgboost": {}}, False),
        (".spec.mlPolicy", {"flux": {}, "torch": {}}, False),
        (".spec.mlPolicy", {"xgboost": {}}, True),
        (".spec.mlPolicy.flux.numProcPerNode", 0, False),
        (".spec.mlPolicy.flux.numProcPerNode", 2, True),
        (".spec.mlPolicy.torch.envInjection.targets[].containerNames", ["sidecar", "node"], False),
        (".spec.mlPolicy.torch.envInjection.targets[].containerNames", ["sidecar"], True),
    ],
)
def test_runtime_cel_rules_accept_and_reject_like_upstream(path: str, value: Any, accepted: bool) -> None:
    assert all(_cel_accepts(rule, value) for rule in _rules_at("trainer.kubeflow.org_clustertrainingruntimes.yaml", path)) is accepted


@pytest.mark.parametrize(
    ("name", "accepted"),
    [("mnist", True), ("a" * 63, True), ("a" * 64, False), ("Mnist", False), ("1job", False), ("job-", False)],
)
def test_trainjob_name_rules(name: str, accepted: bool) -> None:
    rules = _rules_at("trainer.kubeflow.org_trainjobs.yaml", "")
    assert all(_cel_accepts(rule, {"metadata": {"name": name}}) for rule in rules) is accepted


@pytest.mark.parametrize(
    ("path", "old", "new", "accepted"),
    [
        # trainyard's spec.trainer rule: v2.3.0's immutability, numNodes left to the webhook.
        (".spec.trainer", {"numNodes": 2, "image": "a"}, {"numNodes": 4, "image": "a"}, True),
        (".spec.trainer", {"numNodes": 2}, {"numNodes": 2, "image": "b"}, False),
        (".spec.trainer", {"image": "a"}, {"image": "b"}, False),
        (".spec.trainer", {"args": ["x"]}, {}, False),
        (".spec.trainer", {"env": [{"name": "A", "value": "1"}]}, {"env": [{"name": "A", "value": "2"}]}, False),
        (".spec.trainer", {"numProcPerNode": 1}, {"numProcPerNode": 2}, False),
        (".spec.trainer", {"resourcesPerNode": {"limits": {"cpu": 1}}}, {"resourcesPerNode": {"limits": {"cpu": 1}}}, True),
        (".spec.initializer", {"model": {"storageUri": "hf://a"}}, {"model": {"storageUri": "hf://b"}}, False),
        (".spec.activeDeadlineSeconds", 60, 61, False),
        (".spec.initializer.model.storageUri", None, "hf://org/model", True),
        (".spec.initializer.model.storageUri", None, "", True),
        (".spec.initializer.model.storageUri", None, "org/model", False),
        (".status.trainerStatus", None, {"progressPercentage": 3}, False),
        (".status.trainerStatus", None, {"lastUpdatedTime": "2026-01-01T00:00:00Z"}, True),
    ],
)
def test_v23_trainjob_rules(path: str, old: Any, new: Any, accepted: bool) -> None:
    rules = _rules_at("trainer.kubeflow.org_trainjobs.yaml", path)
    assert all(_cel_accepts(rule, new, old) for rule in rules) is accepted
