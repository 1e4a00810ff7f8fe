"""The cluster install of docs/deploy.md, run for real with kubectl on a fresh devcluster.

Step 1 `kubectl apply --server-side -k deploy/crds`, `kubectl wait --for=condition=Established
crd --all`; step 2 `kubectl apply --server-side -k deploy/`. The devcluster starts with no CRDs,
and must store and validate every built-in kind the install uses (apps/v1, policy/v1,
networking.k8s.io/v1, rbac.authorization.k8s.io/v1) from the Kubernetes definitions. Then
what landed is read back and checked against what a production install needs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
NAMESPACE = "kubeflow-system"

pytestmark = pytest.mark.slow


def rendered(path: Path, devcluster) -> list[dict]:
    out = devcluster.kubectl("kustomize", str(path)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def get(devcluster, kind: str, name: str, namespace: str | None = NAMESPACE) -> dict:
    args = ["get", kind, name, "-o", "json", "--show-managed-fields"] + (["-n", namespace] if namespace else [])
    return json.loads(devcluster.kubectl(*args).stdout)


@pytest.fixture(scope="module")
def installed(devcluster_module):
    cluster = devcluster_module
    crds = cluster.kubectl("get", "crds", "-o", "name").stdout.split()
    assert crds == [], f"the devcluster must start without CRDs, has {crds}"
    step1 = cluster.kubectl("apply", "--server-side", "-k", str(DEPLOY / "crds"), timeout=120)
    assert step1.stdout.count("serverside-applied") == 3, step1.stdout
    cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    step2 = cluster.kubectl("apply", "--server-side", "-k", str(DEPLOY), timeout=180)
    return cluster, step2.stdout


def test_step_one_installs_the_trainer_crds_only(installed) -> None:
    cluster, _ = installed
    names = set(cluster.kubectl("get", "crds", "-o", "name").stdout.split())
    assert names == {
        "customresourcedefinition.apiextensions.k8s.io/trainjobs.trainer.kubeflow.org",
        "customresourcedefinition.apiextensions.k8s.io/trainingruntimes.trainer.kubeflow.org",
        "customresourcedefinition.apiextensions.k8s.io/clustertrainingruntimes.trainer.kubeflow.org",
    }  # JobSet, PodGroup and Queue only through the optional deploy/crds/dependencies


def test_step_two_creates_every_object(installed) -> None:
    cluster, output = installed
    expected = rendered(DEPLOY, cluster)
    assert len(expected) > 30
    for doc in expected:
        meta = doc["metadata"]
        namespace = meta.get("namespace")
        live = get(cluster, f"{doc['kind']}.{doc['apiVersion'].split('/')[0]}" if "/" in doc["apiVersion"]
                   else doc["kind"], meta["name"], namespace)
        assert live["metadata"]["name"] == meta["name"]
        managers = {m["manager"] for m in live["metadata"].get("managedFields") or []}
        assert "kubectl" in managers, (doc["kind"], meta["name"], managers)
    assert output.count("serverside-applied") == len(expected), output


def test_services_are_replicated_probed_and_locked_down(installed) -> None:
    cluster, _ = installed
    for name in ("watcher", "planner", "applier", "status"):
        deployment = get(cluster, "deployment.apps", f"trainyard-{name}")
        spec = deployment["spec"]
        assert spec["replicas"] >= 2
        pod = spec["template"]["spec"]
        assert pod["serviceAccountName"] == f"trainyard-{name}"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = pod["containers"]
        assert container["image"] == "ghcr.io/trainyard/trainyard:0.1.0"  # from kustomize images:
        assert container["args"][0] == name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
        assert container["resources"]["limits"]["cpu"] == "1"  # one event loop: docs/deploy.md
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        budget = get(cluster, "poddisruptionbudget.policy", f"trainyard-{name}")
        assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_nats_is_a_three_node_jetstream_cluster(installed) -> None:
    cluster, _ = installed
    sts = get(cluster, "statefulset.apps", "trainyard-nats")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == \
        "kubernetes.io/hostname"
    config = get(cluster, "configmap", "trainyard-nats")["data"]["nats.conf"]
    assert "jetstream" in config and config.count("trainyard-nats-headless") == 3
    headless = get(cluster, "service", "trainyard-nats-headless")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    env = {e["name"]: e.get("value") for e in
           get(cluster, "deployment.apps", "trainyard-applier")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TRAINYARD_BUS_REPLICAS"] == "3"


def test_rbac_is_per_service_and_least_privilege(installed) -> None:
    cluster, _ = installed
    applier = get(cluster, "clusterrole.rbac.authorization.k8s.io", "trainyard-applier", None)
    assert any("trainjobs/finalizers" in rule["resources"] and rule["verbs"] == ["update"]
               for rule in applier["rules"])
    for name in ("watcher", "planner", "applier", "status"):
        role = get(cluster, "clusterrole.rbac.authorization.k8s.io", f"trainyard-{name}", None)
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], (name, rule)
        binding = get(cluster, "clusterrolebinding.rbac.authorization.k8s.io", f"trainyard-{name}", None)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"trainyard-{name}", "namespace": NAMESPACE}]
    watcher = get(cluster, "clusterrole.rbac.authorization.k8s.io", "trainyard-watcher", None)
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in watcher["rules"])
    policies = json.loads(cluster.kubectl("get", "networkpolicies.networking.k8s.io", "-n", NAMESPACE,
                                          "-o", "json").stdout)["items"]
    assert {p["metadata"]["name"] for p in policies} >= {"trainyard-nats", "trainyard-services"}


def test_runtimes_and_webhook_are_installed(installed) -> None:
    cluster, _ = installed
    runtimes = cluster.kubectl("get", "clustertrainingruntimes", "-o", "name").stdout.split()
    assert "clustertrainingruntime.trainer.kubeflow.org/torch-distributed" in runtimes
    listed = yaml.safe_load((DEPLOY / "runtimes" / "kustomization.yaml").read_text())["resources"]
    assert len(runtimes) == len(listed)
    webhook = get(cluster, "validatingwebhookconfiguration", "validator.trainer.kubeflow.org", None)
    for hook in webhook["webhooks"]:
        service = hook["clientConfig"]["service"]
        assert (service["name"], service["namespace"]) == ("kubeflow-trainer-controller-manager", NAMESPACE)
        assert hook["failurePolicy"] == "Fail"
    # v2.3.0's TrainJob defaulter (runtimePatches[].time), behind the same Service.
    defaulter = get(cluster, "mutatingwebhookconfiguration", "defaulter.trainer.kubeflow.org", None)
    (hook,) = defaulter["webhooks"]
    assert hook["name"] == "defaulter.trainjob.trainer.kubeflow.org" and hook["failurePolicy"] == "Fail"
    assert hook["clientConfig"]["service"]["path"] == "/mutate-trainer-kubeflow-org-v1alpha1-trainjob"
    assert hook["clientConfig"]["service"]["name"] == "kubeflow-trainer-controller-manager"
    service = get(cluster, "service", "kubeflow-trainer-controller-manager")
    assert service["spec"]["ports"][0]["targetPort"] == 9443
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "planner"


def test_dependency_crds_install_on_their_own(devcluster) -> None:
    devcluster.kubectl("apply", "--server-side", "-k", str(DEPLOY / "crds" / "dependencies"), timeout=120)
    names = set(devcluster.kubectl("get", "crds", "-o", "name").stdout.split())
    assert {n.rsplit("/", 1)[1] for n in names} == {
        "jobsets.jobset.x-k8s.io", "podgroups.scheduling.x-k8s.io", "podgroups.scheduling.volcano.sh",
        "queues.scheduling.volcano.sh"}


BAD_DEPLOYMENTS = {
    "replicas: two": ("replicas: two", "spec.replicas: Invalid value: \"two\": must be of type integer"),
    "no selector": ("", "spec.selector: Required value"),
    "selector mismatch": ("selector: {matchLabels: {app: other}}",
                          "`selector` does not match template `labels`"),
    "port as text": ("", 'spec.template.spec.containers[0].ports[0].containerPort: Invalid value: "http": '
                         "must be of type integer"),
}


@pytest.mark.parametrize("case", sorted(BAD_DEPLOYMENTS))
def test_devcluster_validates_stored_only_kinds(devcluster_module, case: str) -> None:
    line, message = BAD_DEPLOYMENTS[case]
    selector = "selector: {matchLabels: {app: x}}" if case in ("replicas: two", "port as text") else ""
    port = "http" if case == "port as text" else "80"
    manifest = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: bad-{case.replace(' ', '-').replace(':', '')}, namespace: default}}
spec:
  {line}
  {selector}
  template:
    metadata: {{labels: {{app: x}}}}
    spec:
      containers: [{{name: c, image: busybox, ports: [{{containerPort: {port}}}]}}]
"""
    result = devcluster_module.kubectl("apply", "--server-side", "-f", "-", input=manifest, check=False)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr
    assert "is invalid" in result.stderr


def test_devcluster_rejects_unknown_fields_and_wrong_role_kinds(devcluster_module) -> None:
    unknown = devcluster_module.kubectl("apply", "--server-side", "-f", "-", check=False, input="""
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: strict, namespace: default}
spec: {maxUnavailable: 1, selector: {matchLabels: {a: b}}, maxUnavalable: 2}
""")
    assert unknown.returncode != 0 and 'unknown field "spec.maxUnavalable"' in unknown.stderr, unknown.stderr
    binding = devcluster_module.kubectl("create", "-f", "-", check=False, input="""
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: wrong}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}
subjects: [{kind: ServiceAccount, name: s, namespace: default}]
""")
    assert binding.returncode != 0 and 'roleRef.kind: Unsupported value: "Role"' in binding.stderr, binding.stderr


def test_applying_step_two_again_changes_nothing(installed) -> None:
    cluster, _ = installed
    before = {name: get(cluster, "deployment.apps", f"trainyard-{name}")["metadata"]["resourceVersion"]
              for name in ("watcher", "planner", "applier", "status")}
    sts_before = get(cluster, "statefulset.apps", "trainyard-nats")["metadata"]["resourceVersion"]
    cluster.kubectl("apply", "--server-side", "-k", str(DEPLOY), timeout=180)
    after = {name: get(cluster, "deployment.apps", f"trainyard-{name}")["metadata"]["resourceVersion"]
             for name in ("watcher", "planner", "applier", "status")}
    assert after == before
    assert get(cluster, "statefulset.apps", "trainyard-nats")["metadata"]["resourceVersion"] == sts_before


def test_core_kinds_of_the_install_are_validated_too(devcluster_module) -> None:
    service = devcluster_module.kubectl("apply", "--server-side", "-f", "-", check=False, input="""
apiVersion: v1
kind: Service
metadata: {name: bad-port, namespace: default}
spec: {selector: {a: b}, ports: [{name: http, port: "eighty"}]}
""")
    assert service.returncode != 0
    assert 'spec.ports[0].port: Invalid value: "eighty": must be of type integer' in service.stderr, service.stderr
    hook = devcluster_module.kubectl("create", "-f", "-", check=False, input="""
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: incomplete}
webhooks: [{name: a.example.com, clientConfig: {url: "https://127.0.0.1:1/x"}}]
""")
    assert hook.returncode != 0
    assert "webhooks[0].sideEffects: Required value" in hook.stderr, hook.stderr
