"""The scale subresource of custom resources, HorizontalPodAutoscalers and elastic Indexed Job
updates, against a real devcluster with the real kubectl (one server for the module)."""
from __future__ import annotations

import base64
import json
import ssl

import httpx
import pytest
import yaml
from aiohttp import web

from trainyard_services.devcluster.tls import ensure_credentials

GROUP = "scaling.example.com"
BASE = f"/apis/{GROUP}/v1/namespaces/default/workers"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"workers.{GROUP}"},
    "spec": {"group": GROUP, "scope": "Namespaced",
             "names": {"plural": "workers", "singular": "worker", "kind": "Worker", "listKind": "WorkerList"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "subresources": {"status": {}, "scale": {
                               "specReplicasPath": ".spec.pool.size", "statusReplicasPath": ".status.size",
                               "labelSelectorPath": ".status.selector"}},
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "properties": {
                                   "pool": {"type": "object", "properties": {
                                       "size": {"type": "integer", "maximum": 10}},
                                       "x-kubernetes-validations": [{"rule": "!has(self.size) || self.size != 7",
                                                                     "message": "seven workers are not allowed"}]},
                                   "note": {"type": "string"}}},
                               "status": {"type": "object", "properties": {
                                   "size": {"type": "integer"}, "selector": {"type": "string"}}}}}}}]}}


def worker(name: str, size: int | None = 2) -> dict:
    spec: dict = {"note": "x"}
    if size is not None:
        spec["pool"] = {"size": size}
    return {"apiVersion": f"{GROUP}/v1", "kind": "Worker", "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def cluster(devcluster_module):
    devcluster_module.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    devcluster_module.kubectl("wait", "--for=condition=Established", f"crd/workers.{GROUP}")
    return devcluster_module


def client(cluster) -> httpx.Client:
    return cluster.client(timeout=20)


def test_discovery_names_the_scale_subresource_as_autoscaling_v1_scale(cluster):
    with client(cluster) as c:
        legacy = c.get(f"/apis/{GROUP}/v1").json()
        entry = next(r for r in legacy["resources"] if r["name"] == "workers/scale")
        assert (entry["group"], entry["version"], entry["kind"]) == ("autoscaling", "v1", "Scale")
        assert sorted(entry["verbs"]) == ["get", "patch", "update"]
        aggregated = c.get("/apis", headers={
            "Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}).json()
        group = next(i for i in aggregated["items"] if i["metadata"]["name"] == GROUP)
        resource = next(r for r in group["versions"][0]["resources"] if r["resource"] == "workers")
        scale = next(s for s in resource["subresources"] if s["subresource"] == "scale")
        assert scale["responseKind"] == {"group": "autoscaling", "version": "v1", "kind": "Scale"}


def test_kubectl_scale_changes_the_spec_path_and_get_answers_a_scale(cluster):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(worker("w1")))
    out = cluster.kubectl("scale", "worker/w1", "--replicas=4")
    assert out.stdout.strip() == f"worker.{GROUP}/w1 scaled"
    obj = json.loads(cluster.kubectl("get", "worker/w1", "-o", "json", "--show-managed-fields").stdout)
    assert obj["spec"] == {"note": "x", "pool": {"size": 4}}
    assert obj["metadata"]["generation"] == 2
    assert any(e.get("subresource") == "scale" for e in obj["metadata"]["managedFields"])
    with client(cluster) as c:
        # the status paths feed status.replicas and status.selector
        body = dict(obj, status={"size": 3, "selector": "app=w1"})
        assert c.put(f"{BASE}/w1/status", json=body).status_code == 200
        scale = c.get(f"{BASE}/w1/scale").json()
        current = c.get(f"{BASE}/w1").json()["metadata"]
    assert scale == {"kind": "Scale", "apiVersion": "autoscaling/v1",
                     "metadata": {"name": "w1", "namespace": "default", "uid": current["uid"],
                                  "resourceVersion": current["resourceVersion"],
                                  "creationTimestamp": current["creationTimestamp"]},
                     "spec": {"replicas": 4}, "status": {"replicas": 3, "selector": "app=w1"}}
    # --current-replicas makes kubectl GET the Scale and PUT it back
    cluster.kubectl("scale", "worker/w1", "--current-replicas=4", "--replicas=5")
    assert json.loads(cluster.kubectl("get", "worker/w1", "-o", "json").stdout)["spec"]["pool"]["size"] == 5
    refused = cluster.kubectl("scale", "worker/w1", "--current-replicas=2", "--replicas=6", check=False)
    assert refused.returncode != 0 and "Expected replicas to be 2, was 5" in refused.stderr


def test_scale_writes_use_optimistic_concurrency_and_every_patch_type(cluster):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(worker("w2")))
    with client(cluster) as c:
        scale = c.get(f"{BASE}/w2/scale").json()
        stale = dict(scale, spec={"replicas": 3})
        assert c.put(f"{BASE}/w2/scale", json=stale).status_code == 200
        again = c.put(f"{BASE}/w2/scale", json=dict(scale, spec={"replicas": 6}))
        assert again.status_code == 409
        assert again.json()["message"] == (f'Operation cannot be fulfilled on workers.{GROUP} "w2": the object has '
                                           "been modified; please apply your changes to the latest version and try again")
        unconditional = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "w2"},
                         "spec": {"replicas": 6}}
        assert c.put(f"{BASE}/w2/scale", json=unconditional).json()["spec"] == {"replicas": 6}
        elsewhere = dict(unconditional, metadata={"name": "w2", "namespace": "other"})
        moved = c.put(f"{BASE}/w2/scale", json=elsewhere)
        assert moved.status_code == 400 and "does not match the namespace" in moved.json()["message"]
        assert c.get(f"{BASE}/missing/scale").json()["message"] == f'workers.{GROUP} "missing" not found'
        for content_type, body, want in (
                ("application/merge-patch+json", {"spec": {"replicas": 1}}, 1),
                ("application/strategic-merge-patch+json", {"spec": {"replicas": 2}}, 2),
                ("application/json-patch+json", [{"op": "replace", "path": "/spec/replicas", "value": 8}], 8)):
            answer = c.patch(f"{BASE}/w2/scale", content=json.dumps(body), headers={"Content-Type": content_type})
            assert answer.status_code == 200, answer.text
            assert answer.json()["spec"]["replicas"] == want
        # the patches above made their client the owner of the replicas: an apply takes over with force
        applied = c.patch(f"{BASE}/w2/scale", params={"fieldManager": "scaler", "force": "true"},
                          content=json.dumps({"apiVersion": "autoscaling/v1", "kind": "Scale",
                                              "metadata": {"name": "w2"}, "spec": {"replicas": 9}}),
                          headers={"Content-Type": "application/apply-patch+yaml"})
        assert applied.status_code == 200 and applied.json()["spec"]["replicas"] == 9
        assert c.get(f"{BASE}/w2").json()["spec"]["pool"]["size"] == 9
        bad = c.patch(f"{BASE}/w2/scale", content=json.dumps({"spec": {"replicas": "three"}}),
                      headers={"Content-Type": "application/merge-patch+json"})
        assert bad.status_code == 400
        assert bad.json()["message"] == ('Scale in version "v1" cannot be handled as a Scale: json: cannot unmarshal '
                                         "string into Go struct field ScaleSpec.spec.replicas of type int32")


def test_field_ownership_of_the_replicas_moves_with_scale_writes(cluster):
    """Server-Side Apply and the scale subresource, as kube-apiserver's ScaleHandler does it: an
    apply of a Scale conflicts with the object's manager of the spec path unless forced; a
    forced apply or a scale update takes the path over (subresource scale); the old manager's
    next apply of another value then conflicts."""
    cluster.kubectl("apply", "--server-side", "--field-manager=owner", "-f", "-", input=json.dumps(worker("w6")))
    config = json.dumps({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "w6"},
                         "spec": {"replicas": 5}})
    with client(cluster) as c:
        refused = c.patch(f"{BASE}/w6/scale", params={"fieldManager": "autoscaler"}, content=config,
                          headers={"Content-Type": "application/apply-patch+yaml"})
        assert refused.status_code == 409
        assert refused.json()["message"] == 'Apply failed with 1 conflict: conflict with "owner": .spec.replicas'
        forced = c.patch(f"{BASE}/w6/scale", params={"fieldManager": "autoscaler", "force": "true"}, content=config,
                         headers={"Content-Type": "application/apply-patch+yaml"})
        assert forced.status_code == 200 and forced.json()["spec"] == {"replicas": 5}
        managed = {(e["manager"], e["operation"], e.get("subresource", "")): e["fieldsV1"]
                   for e in c.get(f"{BASE}/w6").json()["metadata"]["managedFields"]}
    assert managed[("autoscaler", "Apply", "scale")] == {"f:spec": {"f:pool": {"f:size": {}}}}
    assert managed[("owner", "Apply", "")] == {"f:spec": {"f:note": {}}}
    again = cluster.kubectl("apply", "--server-side", "--field-manager=owner", "-f", "-",
                            input=json.dumps(worker("w6")), check=False)
    assert again.returncode != 0
    assert 'conflict with "autoscaler" with subresource "scale": .spec.pool.size' in again.stderr
    cluster.kubectl("scale", "worker/w6", "--replicas=3")
    fields = json.loads(cluster.kubectl("get", "worker/w6", "-o", "json", "--show-managed-fields").stdout)
    owners = {(e["manager"], e["operation"], e.get("subresource", "")) for e in fields["metadata"]["managedFields"]
              if "f:size" in (e["fieldsV1"].get("f:spec", {}).get("f:pool") or {})}
    assert owners == {("kubectl", "Update", "scale")}


def test_scale_writes_go_through_the_schema_and_cel_rules_of_the_object(cluster):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(worker("w3")))
    too_many = cluster.kubectl("scale", "worker/w3", "--replicas=11", check=False)
    assert too_many.returncode != 0
    assert too_many.stderr.strip() == ('The Worker "w3" is invalid: spec.pool.size: Invalid value: 11: '
                                       "spec.pool.size in body should be less than or equal to 10")
    unlucky = cluster.kubectl("scale", "worker/w3", "--replicas=7", check=False)
    assert "spec.pool: Invalid value: \"object\": seven workers are not allowed" in unlucky.stderr
    with client(cluster) as c:
        negative = c.patch(f"{BASE}/w3/scale", content=json.dumps({"spec": {"replicas": -1}}),
                           headers={"Content-Type": "application/merge-patch+json"})
        assert negative.status_code == 422
        assert ".spec.pool.size: Invalid value: -1: should be a non-negative integer" in negative.json()["message"]
        typed = c.patch(f"{BASE}/w3", content=json.dumps({"spec": {"pool": {"size": "two"}}}),
                        headers={"Content-Type": "application/merge-patch+json"}).json()
        # the schema's type error, then kube-apiserver's check of the scale path (both reported)
        causes = typed["details"]["causes"]
        assert causes[0]["field"] == "spec.pool.size"
        assert {"reason": "FieldValueInvalid", "field": ".spec.pool.size", "message": (
            "Invalid value: 0: .spec.pool.size accessor error: two is of the type string, expected int64")} in causes
        assert c.get(f"{BASE}/w3").json()["spec"]["pool"]["size"] == 2


def test_an_object_without_the_spec_path_scales_only_when_the_write_names_replicas(cluster):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(worker("w4", size=None)))
    with client(cluster) as c:
        assert c.get(f"{BASE}/w4/scale").json()["spec"] == {}
        empty = c.patch(f"{BASE}/w4/scale", content=json.dumps({"metadata": {"labels": {"a": "b"}}}),
                        headers={"Content-Type": "application/merge-patch+json"})
        assert empty.status_code == 400
        assert empty.json()["message"] == 'the spec replicas field ".spec.pool.size" cannot be empty'
    cluster.kubectl("scale", "worker/w4", "--replicas=3")
    assert json.loads(cluster.kubectl("get", "worker/w4", "-o", "json").stdout)["spec"]["pool"] == {"size": 3}


async def test_webhooks_matching_the_scale_subresource_see_scale_objects(cluster, tmp_path):
    """Rules naming ``workers/scale`` or ``*/scale`` match a scale request and receive the
    autoscaling/v1 Scale; rules naming only ``workers`` (or ``*``) do not."""
    creds = ensure_credentials(tmp_path / "hook")
    seen: dict[str, list[dict]] = {}

    async def review(request: web.Request) -> web.Response:
        body = await request.json()
        req = body["request"]
        seen.setdefault(request.path, []).append(req)
        replicas = ((req.get("object") or {}).get("spec") or {}).get("replicas")
        allowed = not (request.path == "/scale" and replicas == 5)
        response = {"uid": req["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": "five is too many for this tenant"}
        if request.path == "/mutate" and replicas == 9:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(
                [{"op": "replace", "path": "/spec/replicas", "value": 8}]).encode()).decode()
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": response})

    app = web.Application()
    for path in ("/scale", "/wildcard", "/main", "/star", "/mutate"):
        app.router.add_post(path, review)
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(creds.server_cert, creds.server_key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    url = f"https://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    ca = base64.b64encode(creds.ca_cert.read_bytes()).decode()

    def hook(name: str, path: str, resources: list[str]) -> dict:
        return {"name": name, "clientConfig": {"url": url + path, "caBundle": ca},
                "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                "rules": [{"operations": ["UPDATE"], "apiGroups": [GROUP], "apiVersions": ["v1"],
                           "resources": resources}]}
    configs = [
        ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration", "scale-guard",
         [hook("scale.example.com", "/scale", ["workers/scale"]), hook("wild.example.com", "/wildcard", ["*/scale"]),
          hook("main.example.com", "/main", ["workers"]), hook("star.example.com", "/star", ["*"])]),
        ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration", "scale-mutator",
         [hook("mutate.example.com", "/mutate", ["workers/scale"])]),
    ]
    sslctx = ssl.create_default_context(cafile=str(cluster.ca_cert))
    try:
        async with httpx.AsyncClient(base_url=cluster.url, verify=sslctx, timeout=20,
                                     headers={"Authorization": f"Bearer {cluster.token}"}) as c:
            created = await c.post(BASE, json=worker("w5"))
            assert created.status_code == 201
            for plural, kind, name, hooks in configs:
                answer = await c.post(f"/apis/admissionregistration.k8s.io/v1/{plural}", json={
                    "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": name},
                    "webhooks": hooks})
                assert answer.status_code == 201, answer.text
            denied = await c.patch(f"{BASE}/w5/scale", content=json.dumps({"spec": {"replicas": 5}}),
                                   headers={"Content-Type": "application/merge-patch+json"})
            assert denied.status_code == 403
            assert denied.json()["message"] == ('admission webhook "scale.example.com" denied the request: '
                                                "five is too many for this tenant")
            ok = await c.patch(f"{BASE}/w5/scale", content=json.dumps({"spec": {"replicas": 3}}),
                               headers={"Content-Type": "application/merge-patch+json"})
            assert ok.status_code == 200 and ok.json()["spec"]["replicas"] == 3
            mutated = await c.patch(f"{BASE}/w5/scale", content=json.dumps({"spec": {"replicas": 9}}),
                                    headers={"Content-Type": "application/merge-patch+json"})
            assert mutated.json()["spec"]["replicas"] == 8
            assert (await c.get(f"{BASE}/w5")).json()["spec"]["pool"]["size"] == 8
            main = await c.patch(f"{BASE}/w5", content=json.dumps({"spec": {"note": "main"}}),
                                 headers={"Content-Type": "application/merge-patch+json"})
            assert main.status_code == 200
            for plural, _, name, _ in configs:
                await c.delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}")
    finally:
        await runner.cleanup()
    scale_requests = seen["/scale"]
    assert len(scale_requests) == 3 and len(seen["/wildcard"]) == 3
    first = scale_requests[0]
    assert first["kind"] == {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    assert first["requestKind"] == first["kind"]
    assert first["resource"] == {"group": GROUP, "version": "v1", "resource": "workers"}
    assert (first["subResource"], first["requestSubResource"], first["operation"]) == ("scale", "scale", "UPDATE")
    assert first["object"]["kind"] == "Scale" and first["object"]["spec"] == {"replicas": 5}
    assert first["oldObject"]["spec"] == {"replicas": 2}
    assert first["object"]["metadata"]["name"] == "w5" and first["namespace"] == "default"
    # the main-resource hooks saw only the main-resource write
    assert [r.get("subResource") for r in seen["/main"]] == [None]
    assert [r.get("subResource") for r in seen["/star"]] == [None]
    assert seen["/main"][0]["kind"]["kind"] == "Worker"


def test_horizontal_pod_autoscaler_targeting_a_scale_subresource_is_stored_and_validated(cluster):
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "w1"},
           "spec": {"scaleTargetRef": {"apiVersion": f"{GROUP}/v1", "kind": "Worker", "name": "w1"},
                    "minReplicas": 1, "maxReplicas": 4,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": 80}}}]}}
    out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(hpa))
    assert out.stdout.strip() == "horizontalpodautoscaler.autoscaling/w1 created"
    stored = json.loads(cluster.kubectl("get", "hpa", "w1", "-o", "json").stdout)
    assert stored["spec"]["scaleTargetRef"]["kind"] == "Worker"
    inverted = json.loads(json.dumps(hpa))
    inverted["metadata"]["name"] = "inverted"
    inverted["spec"].update(minReplicas=5, maxReplicas=2)
    refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(inverted), check=False)
    assert refused.returncode != 0
    assert refused.stderr.strip() == ('The HorizontalPodAutoscaler "inverted" is invalid: spec.maxReplicas: '
                                      "Invalid value: 2: must be greater than or equal to `minReplicas`")
    kindless = json.loads(json.dumps(hpa))
    kindless["metadata"]["name"] = "kindless"
    del kindless["spec"]["scaleTargetRef"]["kind"]
    refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(kindless), check=False)
    assert refused.stderr.strip() == ('The HorizontalPodAutoscaler "kindless" is invalid: '
                                      "spec.scaleTargetRef.kind: Required value")
    # kubectl autoscale (a protobuf autoscaling/v2 body) targets the custom resource's scale subresource
    cluster.kubectl("apply", "-f", "-", input=json.dumps(worker("w7")))
    made = cluster.kubectl("autoscale", "worker/w7", "--min=2", "--max=5", "--cpu=70%")
    assert made.stdout.strip() == "horizontalpodautoscaler.autoscaling/w7 autoscaled"
    spec = json.loads(cluster.kubectl("get", "hpa", "w7", "-o", "json").stdout)["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": f"{GROUP}/v1", "kind": "Worker", "name": "w7"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 5)
    assert spec["metrics"] == [{"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": 70}}}]


def test_indexed_job_completions_change_only_in_tandem_with_parallelism(cluster):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "elastic"},
           "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "template": {"spec": {
               "restartPolicy": "Never", "containers": [{"name": "c", "image": "x", "command": ["true"]}]}}}}
    plain = json.loads(json.dumps(job))
    plain["metadata"]["name"] = "plain"
    del plain["spec"]["completionMode"]
    with client(cluster) as c:
        jobs = "/apis/batch/v1/namespaces/default/jobs"
        assert c.post(jobs, json=job).status_code == 201
        assert c.post(jobs, json=plain).status_code == 201
        alone = c.patch(f"{jobs}/elastic", content=json.dumps({"spec": {"completions": 3}}),
                        headers={"Content-Type": "application/merge-patch+json"})
        assert alone.status_code == 422
        assert alone.json()["message"] == ('Job.batch "elastic" is invalid: spec.completions: Invalid value: 3: '
                                           "can only be modified in tandem with spec.parallelism")
        both = c.patch(f"{jobs}/elastic", content=json.dumps({"spec": {"completions": 3, "parallelism": 3}}),
                       headers={"Content-Type": "application/merge-patch+json"})
        assert both.status_code == 200 and both.json()["spec"]["completions"] == 3
        fixed = c.patch(f"{jobs}/plain", content=json.dumps({"spec": {"completions": 3, "parallelism": 3}}),
                        headers={"Content-Type": "application/merge-patch+json"})
        assert fixed.status_code == 422
        assert fixed.json()["message"] == 'Job.batch "plain" is invalid: spec.completions: Invalid value: 3: field is immutable'


def test_kubectl_scale_trainjob_through_the_trainjob_crd(cluster):
    """The TrainJob CRD's scale subresource (specReplicasPath .spec.trainer.numNodes)."""
    from pathlib import Path
    crd = yaml.safe_load((Path(__file__).resolve().parents[3] / "deploy" / "crds" /
                          "trainer.kubeflow.org_trainjobs.yaml").read_text())
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(crd))
    cluster.kubectl("wait", "--for=condition=Established", "crd/trainjobs.trainer.kubeflow.org")
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj"},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(trainjob))
    out = cluster.kubectl("scale", "trainjob/tj", "--replicas=3")
    assert out.stdout.strip() == "trainjob.trainer.kubeflow.org/tj scaled"
    got = json.loads(cluster.kubectl("get", "trainjob/tj", "-o", "json").stdout)
    assert got["spec"]["trainer"]["numNodes"] == 3
    scale = json.loads(cluster.kubectl("get", "--raw",
                                       "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/tj/scale").stdout)
    assert (scale["kind"], scale["spec"], scale["status"]) == ("Scale", {"replicas": 3}, {"replicas": 0})
    # kubectl's --subresource flag reads and patches the same Scale
    patched = cluster.kubectl("patch", "trainjob/tj", "--subresource=scale", "--type=merge", "-p",
                              '{"spec":{"replicas":4}}')
    assert patched.stdout.strip() == "scale.autoscaling/tj patched"
    read = json.loads(cluster.kubectl("get", "trainjob/tj", "--subresource=scale", "-o", "json").stdout)
    assert read["spec"] == {"replicas": 4}
