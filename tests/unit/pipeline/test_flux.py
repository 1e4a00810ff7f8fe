"""The v2.3.0 Flux plugin as table tests, written from upstream's test cases (flux_test.go:
TestFlux, TestValidate, TestGenerateRange, TestGenerateHostlist, TestEncodeZ85,
TestBuildCurveSecret, TestGetOriginalCommand) and its facts; where trainyard deliberately
differs (a random CURVE key kept like the MPI SSH key instead of one derived from the UID),
the test says so."""
from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fixtures.pipeline_builders import container, find, job, pod_spec, runtime, trainjob
from trainyard.pipeline import validate_trainjob
from fixtures.pipeline_builders import plan_past_snapshot as plan  # the plugins' objects (test_snapshot.py)

from trainyard.pipeline.curve_keys import (
    Z85_ALPHABET, curve_certificate, deferred_curve_key, new_curve_key_pair, z85_encode,
)
from trainyard.pipeline.plugins.flux import hostlist, number_range
from trainyard.pipeline.ssh_keys import GENERATE_ANNOTATION, defer_generated_secrets, materialize, needs_generation

CM = "test-job-flux-entrypoint"
CURVE = "test-job-flux-curve"
FIXED_SECRET, FIXED_PUBLIC = bytes(range(32)), bytes(range(32, 64))


def fixed_curve_key() -> tuple[bytes, bytes]:
    return FIXED_SECRET, FIXED_PUBLIC


def flux_runtime(policy: dict[str, Any] | None = None, node: dict[str, Any] | None = None,
                 init: list[dict[str, Any]] | None = None, num_nodes: int | None = None) -> dict[str, Any]:
    ml_policy: dict[str, Any] = {"flux": {"numProcPerNode": 1} if policy is None else policy}
    if num_nodes is not None:
        ml_policy["numNodes"] = num_nodes
    pod = {"initContainers": init} if init else None
    return runtime([job("node", node or container("node"), ancestor="trainer", pod=pod)], ml_policy=ml_policy)


def planned(trainer: dict[str, Any] | None = None, rt: dict[str, Any] | None = None,
            observed: list[dict[str, Any]] | None = None, **kw: Any) -> list[dict[str, Any]]:
    spec = {"trainer": trainer} if trainer is not None else {}
    return list(plan(trainjob(uid="test-uid", **spec), rt or flux_runtime(), observed or [],
                     new_curve_key=kw.pop("new_curve_key", fixed_curve_key), **kw).objects)


def node_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return pod_spec(find(objects, "JobSet"), "node")


def owner(uid: str = "test-uid") -> list[dict[str, Any]]:
    return [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "test-job", "uid": uid,
             "controller": True, "blockOwnerDeletion": True}]


def script(objects: list[dict[str, Any]], key: str) -> str:
    return find(objects, "ConfigMap")["data"][key]


def certificate(objects: list[dict[str, Any]]) -> str:
    return base64.b64decode(find(objects, "Secret")["data"]["curve.cert"]).decode()


# --- TestFlux -------------------------------------------------------------------------------

def test_no_action_when_the_flux_policy_is_nil() -> None:
    objects = planned({"numNodes": 2}, runtime([job("node", container("node"), ancestor="trainer")],
                                               ml_policy={"numNodes": 1}))
    assert [o["kind"] for o in objects] == ["JobSet"]
    pod = node_pod(objects)
    assert "initContainers" not in pod and "volumes" not in pod


def test_flux_mutations_are_applied_correctly() -> None:
    objects = planned({"numNodes": 2})
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", CM), ("Secret", CURVE), ("JobSet", "test-job")]
    pod = node_pod(objects)
    assert pod["initContainers"] == [{
        "name": "flux-installer",
        "image": "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy",
        "command": ["/bin/bash", "/etc/flux-config/init.sh"],
        "volumeMounts": [{"name": "flux-install", "mountPath": "/mnt/flux"},
                         {"name": CM, "mountPath": "/etc/flux-config", "readOnly": True}],
    }]
    node = pod["containers"][0]
    assert node["volumeMounts"] == [
        {"name": "flux-install", "mountPath": "/mnt/flux"},
        {"name": "spack-install", "mountPath": "/opt/software"},
        {"name": CM, "mountPath": "/etc/flux-config", "readOnly": True},
        {"name": "flux-curve", "mountPath": "/curve", "readOnly": True},
        {"name": "shared-memory", "mountPath": "/dev/shm", "readOnly": True},
    ]
    assert pod["volumes"] == [
        {"name": "spack-install", "emptyDir": {}},
        {"name": "flux-install", "emptyDir": {}},
        {"name": CM, "configMap": {"name": CM, "defaultMode": 0o755}},
        {"name": "shared-memory", "emptyDir": {"medium": "Memory"}},
        {"name": "flux-curve", "secret": {"secretName": CURVE, "defaultMode": 0o400}},
    ]
    assert node["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh", ""]
    config_map, secret = objects[0], objects[1]
    assert config_map["metadata"] == {"name": CM, "namespace": "default", "ownerReferences": owner()}
    assert sorted(config_map["data"]) == ["entrypoint.sh", "init.sh"]
    assert secret["metadata"] == {"name": CURVE, "namespace": "default", "ownerReferences": owner()}
    assert "type" not in secret and "immutable" not in secret and list(secret["data"]) == ["curve.cert"]


def test_the_runtime_init_containers_and_volumes_are_kept_and_the_installer_comes_last() -> None:
    rt = flux_runtime(init=[container("setup")])
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"] = [
        {"name": "data", "emptyDir": {}}, {"name": "flux-install", "hostPath": {"path": "/x"}}]
    pod = node_pod(planned({"numNodes": 1}, rt))
    assert [c["name"] for c in pod["initContainers"]] == ["setup", "flux-installer"]
    # Upserted by name: the runtime's flux-install volume is replaced in place.
    assert [v["name"] for v in pod["volumes"]] == ["data", "flux-install", "spack-install", CM, "shared-memory",
                                                   "flux-curve"]
    assert pod["volumes"][1] == {"name": "flux-install", "emptyDir": {}}


@pytest.mark.parametrize("trainer, node, command, args", [
    pytest.param({"numNodes": 1, "command": ["python"], "args": ["train.py", "--epochs", "10"]}, container("node"),
                 "python train.py --epochs 10", None, id="trainjob-command-and-args"),
    pytest.param({"numNodes": 1, "command": ["  python  "], "args": [" script.py "]}, container("node"),
                 "python    script.py", None, id="extra-spaces-trimmed"),
    pytest.param({"numNodes": 1}, container("node", command=["lmp", "-in", "x"], args=["-nocite"]),
                 "lmp -in x", ["-nocite"], id="runtime-command-runtime-args-stay"),
    pytest.param({"numNodes": 1, "args": ["b"]}, container("node", command=["a"], args=["r"]),
                 "a b", ["r"], id="runtime-command-trainjob-args"),
])
def test_the_trainer_command_is_wrapped_in_the_entrypoint(trainer: dict, node: dict, command: str,
                                                          args: list[str] | None) -> None:
    container_doc = node_pod(planned(trainer, flux_runtime(node=node)))["containers"][0]
    assert container_doc["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh", command]
    # Upstream clears the TrainJob's args: the runtime's (if any) stay, passed after the command.
    assert container_doc.get("args") == args


def test_without_spec_trainer_the_runtime_command_is_wrapped() -> None:
    objects = planned(None, flux_runtime(node=container("node", command=["sleep", "1"]), num_nodes=3))
    assert node_pod(objects)["containers"][0]["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh", "sleep 1"]
    # Deviation (upstream dereferences spec.trainer.numNodes): the runtime's node count.
    assert "test-job-node-0-[0-2]" in script(objects, "init.sh")


@pytest.mark.parametrize("runtime_env, trainjob_env, image, device, policy", [
    pytest.param([], [], "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy", "eth0", "fcfs", id="defaults"),
    pytest.param([{"name": "FLUX_VIEW_IMAGE", "value": "ghcr.io/converged-computing/flux-view-rocky:tag-9"},
                  {"name": "FLUX_NETWORK_DEVICE", "value": "ib0"}],
                 [], "ghcr.io/converged-computing/flux-view-rocky:tag-9", "ib0", "fcfs", id="runtime-env"),
    pytest.param([{"name": "FLUX_VIEW_IMAGE", "value": "rt"}, {"name": "FLUX_QUEUE_POLICY", "value": "easy"}],
                 [{"name": "FLUX_VIEW_IMAGE", "value": "job"}], "job", "eth0", "easy", id="trainjob-first"),
    pytest.param([{"name": "FLUX_NETWORK_DEVICE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                 [], "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy", "eth0", "fcfs",
                 id="runtime-valueFrom-ignored"),
])
def test_broker_settings_come_from_the_trainer_env(runtime_env: list, trainjob_env: list, image: str,
                                                    device: str, policy: str) -> None:
    trainer: dict[str, Any] = {"numNodes": 1}
    if trainjob_env:
        trainer["env"] = trainjob_env
    objects = planned(trainer, flux_runtime(node=container("node", env=runtime_env)))
    assert node_pod(objects)["initContainers"][0]["image"] == image
    init = script(objects, "init.sh")
    assert f'default_bind = "tcp://{device}:%p"' in init and f'queue-policy = "{policy}"' in init


def test_init_script_writes_the_hostlist_and_broker_config() -> None:
    init = script(planned({"numNodes": 4}), "init.sh")
    assert init.startswith("#!/bin/bash\n")
    assert 'echo "test-job-node-0-[0-3]" > ${config}/etc/flux/system/hostlist' in init
    for line in ("[access]", "allow-guest-user = true", "allow-root-owner = true",
                 'path = "/mnt/flux/config/etc/flux/system/R"',
                 'curve_cert = "/mnt/flux/config/etc/curve/curve.cert"', "default_port = 8050",
                 'default_connect = "tcp://%h.test-job.default.svc.cluster.local:%p"',
                 'hosts = [{ host = "test-job-node-0-[0-3]" }]',
                 'dbpath = "/mnt/flux/config/var/lib/flux/job-archive.sqlite"', 'period = "1m"',
                 'busytimeout = "50s"', "[sched-fluxion-qmanager]"):
        assert line + "\n" in init
    assert "cp -R ${view}/* ${share}/view" in init and "cp -R /opt/software ${share}/" in init
    assert "touch ${share}/flux-operator-done.txt" in init


@pytest.mark.parametrize("trainer, runtime_resources, policy, flags, rspec", [
    pytest.param({"numNodes": 2}, None, {"numProcPerNode": 1}, "-N 2 -n 2", "--cores=0", id="one-proc"),
    pytest.param({"numNodes": 2, "numProcPerNode": 4}, None, {"numProcPerNode": 1}, "-N 2 -n 8", "--cores=0-3",
                 id="trainjob-nproc"),
    pytest.param({"numNodes": 3}, None, {}, "-N 3 -n 3", "--cores=0", id="crd-default-nproc"),
    pytest.param({"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}}}, None,
                 {"numProcPerNode": 2}, "-N 2 -n 4 -g 2", "--cores=0-1 --gpu=0-1", id="trainjob-gpus"),
    pytest.param({"numNodes": 1}, {"requests": {"nvidia.com/gpu": 1}}, {"numProcPerNode": 1},
                 "-N 1 -n 1 -g 1", "--cores=0 --gpu=0", id="runtime-gpus"),
])
def test_entrypoint_runs_the_command_under_flux(trainer: dict, runtime_resources: dict | None, policy: dict,
                                               flags: str, rspec: str) -> None:
    node = container("node", resources=runtime_resources) if runtime_resources else container("node")
    entry = script(planned(trainer, flux_runtime(policy, node=node)), "entrypoint.sh")
    assert f"flux R encode --hosts=$(cat ${{config}}/etc/flux/system/hostlist) {rspec} > /tmp/R\n" in entry
    assert f"flux run {flags} ${{command}}\n" in entry
    assert 'if [ "$(hostname)" = "test-job-node-0-0" ]; then' in entry
    assert "cp /curve/curve.cert ${curve}" in entry and "chmod go-r ${curve}" in entry


# --- TestValidate ---------------------------------------------------------------------------

@pytest.mark.parametrize("policy, trainer, init, texts", [
    pytest.param(None, {}, None, [], id="valid-without-flux"),
    pytest.param({}, {}, None, [], id="valid-with-flux"),
    pytest.param({"numProcPerNode": 0}, {}, None,
                 ["spec.trainer.numProcPerNode: Invalid value: 0: must be greater than or equal to 1 for Flux TrainJob"],
                 id="runtime-nproc-below-one"),
    pytest.param({"numProcPerNode": 1}, {"numProcPerNode": 0}, None,
                 ["spec.trainer.numProcPerNode: Invalid value: 0: must be greater than or equal to 1 for Flux TrainJob"],
                 id="trainjob-nproc-below-one"),
    pytest.param({}, {}, [container("flux-installer")],
                 ['spec.trainer.initContainers: Invalid value: "flux-installer": InitContainer \'flux-installer\' is reserved'],
                 id="reserved-installer"),
])
def test_validate(policy: dict | None, trainer: dict, init: list | None, texts: list[str]) -> None:
    pod = {"initContainers": init} if init else None
    ml_policy = {"flux": policy} if policy is not None else None
    rt = runtime([job("node", container("node"), ancestor="trainer", pod=pod)], ml_policy=ml_policy)
    result = validate_trainjob(trainjob(trainer=trainer), runtime=rt)
    # The runtime's own CRD rule (numProcPerNode >= 1) is not in play: the runtime is not admitted here.
    assert [t for t in result.texts() if "Flux" in t or "flux-installer" in t] == texts


# --- helpers: TestGenerateRange, TestGenerateHostlist, TestEncodeZ85 ---------------------------

@pytest.mark.parametrize("size, start, want", [(1, 0, "0"), (4, 0, "0-3"), (3, 10, "10-12")])
def test_number_range(size: int, start: int, want: str) -> None:
    assert number_range(size, start) == want


@pytest.mark.parametrize("prefix, size, want", [
    ("lammps-job", 1, "lammps-job-node-0-[0]"), ("flux-cluster", 4, "flux-cluster-node-0-[0-3]"),
    ("", 2, "-node-0-[0-1]"),
])
def test_hostlist(prefix: str, size: int, want: str) -> None:
    assert hostlist(prefix, size) == want


@pytest.mark.parametrize("data, want", [
    pytest.param(bytes(32), "0" * 40, id="32-bytes-40-chars"),
    pytest.param(bytes([1, 2, 3]), "", id="invalid-length-empty"),
    pytest.param(bytes(4), "00000", id="zeros"),
    pytest.param(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B]), "HelloWorld", id="rfc32-vector"),
    pytest.param(b"\xff\xff\xff\xff", "%nSc0", id="max"),
])
def test_z85(data: bytes, want: str) -> None:
    assert z85_encode(data) == want


def z85_decode(text: str) -> bytes:
    out = b""
    for start in range(0, len(text), 5):
        value = 0
        for char in text[start:start + 5]:
            value = value * 85 + Z85_ALPHABET.index(char)
        out += value.to_bytes(4, "big")
    return out


# --- TestBuildCurveSecret (and where trainyard differs) ---------------------------------------

def test_curve_certificate_format() -> None:
    text = curve_certificate("test-job", FIXED_SECRET, FIXED_PUBLIC)
    for header in ("metadata\n", "curve\n", '    name = "test-job"\n', f'    public-key = "{z85_encode(FIXED_PUBLIC)}"\n',
                   f'    secret-key = "{z85_encode(FIXED_SECRET)}"\n'):
        assert header in text
    assert text.index("metadata") < text.index("curve\n")


def test_the_curve_key_is_an_x25519_pair() -> None:
    secret, public = new_curve_key_pair()
    assert len(secret) == len(public) == 32
    derived = X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert derived == public
    text = curve_certificate("j", secret, public)
    public_z85 = text.split('public-key = "')[1].split('"')[0]
    assert len(public_z85) == 40 and z85_decode(public_z85) == public


def test_the_curve_secret_is_random_once_then_kept() -> None:
    # Upstream derives the key from the TrainJob's UID (same UID, same key); trainyard draws a
    # fresh key (anyone who can read the TrainJob could compute a derived one) and, like the MPI
    # SSH key, never plans the Secret again while it exists.
    first, second = planned({"numNodes": 1}, new_curve_key=new_curve_key_pair), \
        planned({"numNodes": 1}, new_curve_key=new_curve_key_pair)
    assert certificate(first) != certificate(second)
    assert '    name = "test-job"\n' in certificate(first)
    existing = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": CURVE, "namespace": "default"}}
    kept = planned({"numNodes": 1}, observed=[existing])
    assert [o["kind"] for o in kept] == ["ConfigMap", "JobSet"]


def test_the_planned_curve_secret_carries_no_key_until_the_applier_makes_it() -> None:
    objects = defer_generated_secrets(planned({"numNodes": 1}, new_curve_key=deferred_curve_key))
    secret = find(objects, "Secret")
    assert "data" not in secret and needs_generation(secret)
    assert secret["metadata"]["annotations"] == {GENERATE_ANNOTATION: "flux-curve-certificate"}
    made = materialize(secret)
    assert "annotations" not in made["metadata"] and made["metadata"]["ownerReferences"] == owner()
    text = base64.b64decode(made["data"]["curve.cert"]).decode()
    assert '    name = "test-job"\n' in text and "    secret-key = " in text
    assert materialize(secret)["data"] != made["data"]
    assert find(objects, "ConfigMap")["data"]["init.sh"]  # the scripts are no secret
