"""Property-based fuzzing of what the services read from outside: AdmissionReview bodies to the
planner's webhook (over HTTPS, as the API server calls it) and envelopes on the bus.

One stack for the module: a real nats-server, a real devcluster and the four services as real
processes (watcher, planner with its webhook, applier, status). The properties:

- every fuzzed AdmissionReview is answered with a clear refusal (HTTP 400 with an ``error``
  naming the field, or an AdmissionReview whose response is ``allowed: false`` with a
  message) or a verdict: never a 5xx, never a dead planner;
- every malformed, oversized, wrong-version or forged message published on the real subjects
  is either handled (acknowledged: e.g. another cluster's event is ignored) or ends in the dead
  letter stream with a one-line reason; nothing stays pending, no service dies, and a valid
  TrainJob created after the junk still gets its JobSet.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from fixtures.fuzz_strategies import json_values, paths_of, replaced

from fixtures.devcluster import start_devcluster
from fixtures.nats import NatsServer
from trainyard.bus.envelopes import DEAD_LETTER_DATA_MAX
from trainyard.bus.subjects import (DEFAULT_PARTITIONS, ObjectKey, event_subject, plan_subject, result_subject,
                                    trainjob_partition)
from trainyard.bus.topology import partition_durable
from trainyard.roles import CLUSTER_ROLES

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "crds"
EXAMPLES = int(os.environ.get("TRAINYARD_FUZZ_EXAMPLES", "0"))
SERVICES = CLUSTER_ROLES
# The junk is published on the real subjects of TrainJob default/junk: its home partition's
# subjects, read by each role's durable consumer of that partition.
JUNK_PARTITION = trainjob_partition("default", "junk", DEFAULT_PARTITIONS)
CONSUMERS = {stream: tuple(partition_durable(role, "default", JUNK_PARTITION) for role in roles)
             for stream, roles in {"TY_EVENTS": ("planner", "status"), "TY_PLANS": ("applier",),
                                   "TY_RESULTS": ("status-results",)}.items()}
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
WEBHOOK_CONFIG = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/validator.trainer.kubeflow.org"


def fuzz_settings(default: int) -> settings:
    return settings(max_examples=EXAMPLES or default, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
             "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                 "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                 "spec": {"template": {"spec": {"containers": [{
                     "name": "node", "image": "busybox", "command": ["/bin/sh", "-c", "true"]}]}}}}}]}}},
}


def trainjob(name: str) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1}}}


# ---------------------------------------------------------------------------- the stack


class Stack:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.nats = NatsServer(workdir / "nats-store")
        self.cluster = None
        self.processes: dict[str, subprocess.Popen] = {}
        self.api: httpx.Client | None = None
        self.webhook: httpx.Client | None = None
        self.webhook_urls: dict[str, str] = {}

    def start(self) -> None:
        self.nats.start()
        self.cluster = start_devcluster(self.workdir / "devcluster")
        self.api = httpx.Client(base_url=self.cluster.url, timeout=30,
                                verify=ssl.create_default_context(cafile=str(self.cluster.ca_cert)),
                                headers={"Authorization": f"Bearer {self.cluster.token}"})
        for path in sorted(CRDS.glob("*.yaml")):
            if path.name != "kustomization.yaml":
                answer = self.api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                       json=yaml.safe_load(path.read_text()))
                assert answer.status_code == 201, answer.text
        answer = self.api.post("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", json=RUNTIME)
        assert answer.status_code == 201, answer.text
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        common = ["--kubeconfig", str(self.cluster.kubeconfig), "--nats-url", self.nats.url, "--http-port", "0",
                  "--shutdown-grace", "1"]
        for name in SERVICES:
            extra = ["--webhook-port", "0", "--webhook-namespace", "kubeflow-system", "--webhook-drain", "0"] \
                if name == "planner" else []
            with open(self.workdir / f"{name}.log", "ab") as log:
                self.processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "trainyard.cli.main", name, *common, *extra],
                    stdout=subprocess.DEVNULL, stderr=log, cwd=REPO, env=env)
        deadline = time.monotonic() + 90
        while True:  # the planner registers its webhook once it serves it
            self.assert_alive()
            answer = self.api.get(WEBHOOK_CONFIG)
            if answer.status_code == 200:
                break
            assert time.monotonic() < deadline, "the planner never registered its webhook"
            time.sleep(0.2)
        hooks = answer.json()["webhooks"]
        ca = base64.b64decode(hooks[0]["clientConfig"]["caBundle"]).decode()
        self.webhook = httpx.Client(timeout=60, verify=ssl.create_default_context(cadata=ca))
        self.webhook_urls = {hook["rules"][0]["resources"][0]: hook["clientConfig"]["url"] for hook in hooks}
        # The pipeline works end to end before any junk is sent.
        self.create_and_await_jobset("before-fuzz")

    def assert_alive(self) -> None:
        for name, process in self.processes.items():
            assert process.poll() is None, f"{name} exited ({process.returncode}): " \
                f"{(self.workdir / f'{name}.log').read_text(errors='replace')[-3000:]}"
        assert self.cluster.process.poll() is None, "devcluster exited"
        assert self.nats.proc is not None and self.nats.proc.poll() is None, "nats-server exited"

    def create_and_await_jobset(self, name: str, timeout: float = 90) -> dict:
        answer = self.api.post(TRAINJOBS, json=trainjob(name))
        assert answer.status_code == 201, answer.text
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.api.get(f"{JOBSETS}/{name}")
            if found.status_code == 200:
                return found.json()
            self.assert_alive()
            time.sleep(0.2)
        raise AssertionError(f"no JobSet for TrainJob {name} after the junk")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        for client in (self.api, self.webhook):
            if client is not None:
                client.close()
        if self.cluster is not None:
            self.cluster.stop()
        self.nats.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = Stack(tmp_path_factory.mktemp("fuzz-services"))
    try:
        running.start()
        yield running
        running.assert_alive()
    finally:
        running.stop()


# ---------------------------------------------------------------------------- shared strategies


@st.composite
def mutated(draw, seed):
    """The seed with one value anywhere in it replaced by a random one (or a key dropped)."""
    path = draw(st.sampled_from(paths_of(seed)[1:]))
    if draw(st.integers(0, 4)) == 0:
        clone = json.loads(json.dumps(seed))
        node = clone
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]
        return clone
    return replaced(seed, path, draw(json_values))


# ---------------------------------------------------------------------------- the webhook


def review(obj, operation="CREATE", old=None, uid="4a2f-uid"):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1",
                                             "kind": obj.get("kind", "") if isinstance(obj, dict) else ""},
                        "operation": operation, "object": obj, "oldObject": old, "dryRun": False}}


@st.composite
def admission_bodies(draw, resource: str) -> bytes:
    obj = trainjob("fuzzed") if resource == "trainjobs" else \
        dict(RUNTIME, kind="TrainingRuntime", metadata={"name": "rt", "namespace": "default"}) \
        if resource == "trainingruntimes" else RUNTIME
    valid = review(obj)
    choice = draw(st.integers(0, 10))
    if choice == 0:  # junk bytes and malformed JSON
        return draw(st.one_of(st.binary(max_size=200),
                              st.sampled_from([b"", b"{", b"null", b"[]", b'"x"', b"{\"request\": ", b"NaN"])))
    if choice == 1:  # a valid review cut short
        text = json.dumps(valid)
        return text[:draw(st.integers(0, len(text) - 1))].encode()
    if choice == 2:  # wrong apiVersion / kind of the review itself
        return json.dumps(dict(valid, apiVersion=draw(st.one_of(st.sampled_from(
            ["admission.k8s.io/v1beta1", "v1", "", "admission.k8s.io/v2"]), json_values)),
            kind=draw(st.one_of(st.sampled_from(["AdmissionReview", "Status", ""]), json_values)))).encode()
    if choice == 3:  # missing or odd request, uid
        request = dict(valid["request"])
        for key in draw(st.lists(st.sampled_from(["uid", "object", "operation", "kind"]), max_size=2)):
            request.pop(key, None)
        if draw(st.booleans()):
            request["uid"] = draw(json_values)
        return json.dumps(dict(valid, request=request if draw(st.integers(0, 5)) else draw(json_values))).encode()
    if choice == 4:  # an object of another kind
        other = draw(st.sampled_from([
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}},
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "fuzzed"},
             "spec": {"replicatedJobs": []}},
            trainjob("x") if resource != "trainjobs" else RUNTIME, {}, {"kind": "TrainJob"}]))
        return json.dumps(review(other)).encode()
    if choice == 5:  # a forged oldObject on UPDATE
        old = draw(st.one_of(json_values, mutated(obj), st.just(RUNTIME), st.just(trainjob("another"))))
        return json.dumps(review(obj, draw(st.sampled_from(["UPDATE", "CREATE", "DELETE", "CONNECT", "x"])),
                                 old)).encode()
    if choice == 6:  # a huge body
        size = draw(st.sampled_from([1 << 20, 9 << 20, 24 << 20]))
        padded = json.loads(json.dumps(obj))
        padded.setdefault("metadata", {})["annotations"] = {"pad": "x" * size}
        return json.dumps(review(padded)).encode()
    if choice == 7:  # deep nesting
        depth = draw(st.sampled_from([100, 2000, 100_000]))
        return (json.dumps(review(obj))[:-2] + ', "deep": ' + "[" * depth + "]" * depth + "}}").encode()
    if choice == 8:  # the scale subresource: a Scale, or anything else, under subResource scale
        scale = {"apiVersion": "autoscaling/v1", "kind": "Scale",
                 "metadata": {"name": "fuzzed", "namespace": "default"}, "spec": {"replicas": 2}}
        sent = review(draw(st.one_of(st.just(scale), mutated(scale), st.just(obj))), "UPDATE",
                      draw(st.one_of(st.none(), st.just(scale), mutated(scale))))
        sent["request"]["subResource"] = "scale"
        if draw(st.booleans()):
            sent["request"]["name"] = draw(json_values)
        return json.dumps(sent).encode()
    # a random value anywhere in the object (its runtimeRef and metadata most of all)
    spot = draw(st.sampled_from([("spec", "runtimeRef"), ("spec", "runtimeRef", "name"), ("spec", "runtimeRef", "kind"),
                                 ("metadata",), ("metadata", "name"), ("metadata", "namespace"), ("spec",), None]))
    changed = replaced(obj, spot, draw(st.one_of(json_values, st.sampled_from(
        ["../../secrets", "a/b", "x" * 300, "Torch", "\u0000"])))) if spot and resource == "trainjobs" \
        else draw(mutated(obj))
    return json.dumps(review(changed, draw(st.sampled_from(["CREATE", "UPDATE"])),
                             draw(st.one_of(st.none(), mutated(obj))))).encode()


EXPECTED_KIND = {"trainjobs": "TrainJob", "trainingruntimes": "TrainingRuntime",
                 "clustertrainingruntimes": "ClusterTrainingRuntime"}


def check_review_answer(resource: str, sent: bytes, response: httpx.Response, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:1000]}"
    if response.status_code == 400:
        body = response.json()
        assert isinstance(body.get("error"), str) and body["error"], (what, body)
        assert "Traceback" not in body["error"] and "\n" not in body["error"], (what, body)
        return
    assert response.status_code == 200, f"{what}: {response.status_code} {response.text[:1000]}"
    body = response.json()
    assert body.get("apiVersion") == "admission.k8s.io/v1" and body.get("kind") == "AdmissionReview", (what, body)
    answer = body["response"]
    assert isinstance(answer.get("allowed"), bool), (what, body)
    if not answer["allowed"]:
        assert answer["status"]["message"] and answer["status"]["code"] in (400, 403, 422), (what, body)
    # What was answered was a well-formed review of this webhook's kind: its uid is echoed, and
    # nothing else (another kind, a forged oldObject of another kind, another review version) passes.
    try:
        review = json.loads(sent)
    except RecursionError:  # nested deeper than this test process decodes (the planner did)
        return
    request = review["request"]
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview", what
    assert isinstance(request["uid"], str) and answer["uid"] == request["uid"], (what, body)
    expected = "Scale" if resource == "trainjobs" and request.get("subResource") == "scale" else EXPECTED_KIND[resource]
    assert request["object"]["kind"] == expected, (what, body)
    assert request.get("oldObject") is None or request["oldObject"]["kind"] == expected, (what, body)


@fuzz_settings(60)
@given(data=st.data())
def test_admission_reviews_get_a_clear_answer(stack, fuzz_count, data):
    resource = data.draw(st.sampled_from(sorted(stack.webhook_urls)), label="webhook")
    body = data.draw(admission_bodies(resource), label="body")
    fuzz_count("webhook AdmissionReview bodies")
    response = stack.webhook.post(stack.webhook_urls[resource], content=body,
                                  headers={"Content-Type": "application/json"})
    check_review_answer(resource, body, response, f"{resource} {body[:300]!r}")
    assert stack.processes["planner"].poll() is None, "the planner died"


# ---------------------------------------------------------------------------- the bus


EVENT = {"v": 1, "cluster": "default", "type": "ADDED", "kind": "TrainJob",
         "apiVersion": "trainer.kubeflow.org/v1alpha1", "namespace": "default", "name": "junk", "uid": "u-1",
         "resourceVersion": "1", "generation": 1, "object": trainjob("junk")}
PLAN = {"v": 1, "cluster": "default", "namespace": "default", "name": "junk", "uid": "u-1", "generation": 1,
        "resourceVersion": "1", "planHash": "h", "suspended": False,
        "objects": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "junk", "namespace": "default"}}],
        "owned": [{"apiVersion": "v1", "kind": "ConfigMap", "namespace": "default", "name": "junk"}]}
RESULT = {"v": 1, "cluster": "default", "namespace": "default", "name": "junk", "uid": "u-1", "generation": 1,
          "planHash": "h", "outcome": "applied", "applied": [], "deleted": [], "reason": "", "message": ""}
SUBJECTS = {
    "event": (event_subject(ObjectKey("default", "TrainJob", "default", "junk"), JUNK_PARTITION), EVENT),
    "jobset event": (event_subject(ObjectKey("default", "JobSet", "default", "junk"), JUNK_PARTITION),
                     dict(EVENT, kind="JobSet", apiVersion="jobset.x-k8s.io/v1alpha2")),
    "plan": (plan_subject("default", "default", "junk", JUNK_PARTITION), PLAN),
    "result": (result_subject("default", "default", "junk", JUNK_PARTITION), RESULT),
}
AFTER = itertools.count()
MAX_PAYLOAD = 1024 * 1024  # nats-server's default max_payload


@st.composite
def bus_messages(draw) -> tuple[str, bytes]:
    subject, valid = SUBJECTS[draw(st.sampled_from(sorted(SUBJECTS)))]
    choice = draw(st.integers(0, 7))
    if choice == 0:
        body = draw(st.binary(max_size=200))
    elif choice == 1:  # truncated
        text = json.dumps(valid)
        body = text[:draw(st.integers(0, len(text) - 1))].encode()
    elif choice == 2:  # wrong version
        body = json.dumps(dict(valid, v=draw(st.one_of(st.sampled_from([0, 2, -1, 99, "1", None]), json_values)))).encode()
    elif choice == 3:  # oversized, just under what NATS accepts: valid, or poison (its dead letter is larger)
        padded = json.loads(json.dumps(valid))
        padded["pad"] = "x" * (MAX_PAYLOAD - 4096)
        if draw(st.booleans()):
            padded["v"] = 2
        body = json.dumps(padded).encode()
    elif choice == 4:  # forged fields: another cluster, kind, names that do not match the subject
        forged = dict(valid)
        for key in draw(st.lists(st.sampled_from(["cluster", "kind", "name", "namespace", "uid", "type",
                                                  "generation", "outcome", "apiVersion"]), min_size=1, max_size=3)):
            forged[key] = draw(st.one_of(st.sampled_from(["other", "", "kube-system", "TrainJob", "DELETED",
                                                          "a.b", "x" * 300, -5, 2**63]), json_values))
        body = json.dumps(forged).encode()
    elif choice == 5:  # the object of an event (or the objects of a plan) of another shape
        key = "object" if "object" in valid else "objects" if "objects" in valid else "applied"
        body = json.dumps(dict(valid, **{key: draw(st.one_of(json_values, mutated(valid[key]) if valid[key]
                                                             else json_values))})).encode()
    elif choice == 6:
        body = json.dumps(draw(mutated(valid))).encode()
    else:
        body = json.dumps(draw(json_values)).encode()
    return subject, body


async def _publish_and_settle(url: str, messages: list[tuple[str, bytes]], timeout: float = 120) -> dict:
    """Publishes the junk, then waits until every consumer has nothing pending or unacknowledged;
    returns the dead letters written meanwhile, by (consumer, subject, original data)."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from trainyard.bus.envelopes import DeadLetter, decode

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        first_dead = (await js.stream_info("TY_DEAD_LETTER")).state.last_seq + 1
        for subject, body in messages:
            await js.publish(subject, body)
        deadline = time.monotonic() + timeout
        while True:
            busy = []
            for stream, consumers in CONSUMERS.items():
                for consumer in consumers:
                    info = await js.consumer_info(stream, consumer)
                    if info.num_pending or info.num_ack_pending:
                        busy.append((consumer, info.num_pending, info.num_ack_pending))
            if not busy:
                break
            assert time.monotonic() < deadline, f"consumers never settled: {busy}"
            await asyncio.sleep(0.2)
        sub = await js.pull_subscribe("ty.dead.>", stream="TY_DEAD_LETTER", config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first_dead, ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0))
        letters: dict = {}
        while True:
            try:
                batch = await sub.fetch(200, timeout=1.0)
            except Exception:
                break
            for msg in batch:
                letter = decode(DeadLetter, msg.data)
                letters[(letter.consumer, letter.subject, base64.b64decode(letter.data))] = letter
        await sub.unsubscribe()
        return letters
    finally:
        await nc.close()


def not_an_envelope(stream: str, body: bytes) -> bool:
    """Whether the body cannot be read as the stream's envelope at all (bad JSON, wrong types,
    unknown version): the consumers must dead-letter it at once."""
    from trainyard.bus.envelopes import ApplyResult, EnvelopeError, ObjectEvent, PlanMessage, decode

    model = {"TY_EVENTS": ObjectEvent, "TY_PLANS": PlanMessage, "TY_RESULTS": ApplyResult}[stream]
    try:
        decode(model, body)
    except EnvelopeError:
        return True
    return False


@fuzz_settings(2)
@given(batch=st.lists(bus_messages(), min_size=25, max_size=40))
def test_junk_on_the_bus_is_dead_lettered_and_does_not_block(stack, fuzz_count, batch):
    fuzz_count("bus envelopes", len(batch))
    letters = asyncio.run(_publish_and_settle(stack.nats.url, batch))
    stack.assert_alive()
    last_on_subject = {subject: index for index, (subject, _) in enumerate(batch)}
    for index, (subject, body) in enumerate(batch):
        stream = "TY_EVENTS" if subject.startswith("ty.events.") else \
            "TY_PLANS" if subject.startswith("ty.desired.") else "TY_RESULTS"
        consumers = CONSUMERS[stream]
        for consumer in consumers:
            letter = letters.get((consumer, subject, body[:DEAD_LETTER_DATA_MAX]))
            # Nothing to handle: each consumer dead-letters it, unless a later message on the
            # same subject was queued behind it before it started, which supersedes it unread
            # (the consumers coalesce an object's queued messages; counted in
            # trainyard_coalesced_messages_total). The last one of a subject is never superseded.
            if not_an_envelope(stream, body) and last_on_subject[subject] == index:
                assert letter is not None, f"{consumer}: no dead letter for {body[:200]!r}"
            if letter is not None:
                assert letter.error and "\n" not in letter.error and "Traceback" not in letter.error, letter
                assert letter.truncated == (len(body) > DEAD_LETTER_DATA_MAX), letter
    # A valid TrainJob after the junk still gets its JobSet.
    stack.create_and_await_jobset(f"after-junk-{next(AFTER)}")


# ---------------------------------------------------------------------------- found by the fuzzers

CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}
SCALE = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": [1], "spec": {"replicas": 2}}


def scale_review(obj):
    sent = review(obj, "UPDATE")
    sent["request"]["subResource"] = "scale"
    return sent


@pytest.mark.parametrize("resource,body,error", [
    ("trainjobs", review(trainjob("x"), "UPDATE", [1]), "request.oldObject.kind: expected TrainJob, got a list"),
    ("clustertrainingruntimes", review(CONFIGMAP), "request.object.kind: expected ClusterTrainingRuntime"),
    ("clustertrainingruntimes", review(RUNTIME, "UPDATE", CONFIGMAP), "request.oldObject.kind"),
    ("trainjobs", review(trainjob("x"), uid={"a": 1}), "request.uid: missing"),
    ("trainjobs", review(trainjob("x"), uid=""), "request.uid: missing"),
    ("trainjobs", dict(review(trainjob("x")), apiVersion="admission.k8s.io/v1beta1"), "apiVersion, kind: expected"),
    ("trainjobs", review(dict(trainjob("x"), metadata={"name": "x", "annotations": {"pad": "x" * (9 << 20)}})),
     "request body: larger than 8 MiB"),
])
def test_found_bad_reviews_get_a_clear_400(stack, resource, body, error):
    response = stack.webhook.post(stack.webhook_urls[resource], json=body)
    assert response.status_code == 400, response.text
    assert error in response.json()["error"]


@pytest.mark.parametrize("body", [
    scale_review(SCALE),  # a Scale whose metadata is not an object was a 500
    scale_review(dict(SCALE, metadata={})),  # no name: the lookup read the TrainJob list; a KeyError
    review(replaced(trainjob("x"), ("spec", "runtimeRef", "name"), {"a": 1})),
    review(replaced(trainjob("x"), ("spec", "runtimeRef", "name"), "../../secrets")),
    review(replaced(trainjob("x"), ("metadata", "name"), ["x"])),
])
def test_found_forged_objects_are_answered_not_crashed_on(stack, body):
    response = stack.webhook.post(stack.webhook_urls["trainjobs"], json=body)
    assert response.status_code == 200, response.text
    answer = response.json()["response"]
    assert answer["uid"] == body["request"]["uid"]
    if body["request"].get("subResource") != "scale":  # a Scale of no TrainJob: NotFound is the API server's
        assert answer["allowed"] is False and answer["status"]["message"]


def test_a_poison_message_near_max_payload_still_gets_its_dead_letter(stack):
    # its base64 in a DeadLetter exceeded NATS's max_payload: the letter could not be published,
    # the message was nak'ed until max_deliver and then dropped with no reason recorded anywhere
    body = json.dumps(dict(PLAN, v=2, pad="x" * (MAX_PAYLOAD - 4096))).encode()
    subject, _ = SUBJECTS["plan"]
    letters = asyncio.run(_publish_and_settle(stack.nats.url, [(subject, body)]))
    letter = letters[(CONSUMERS["TY_PLANS"][0], subject, body[:DEAD_LETTER_DATA_MAX])]
    assert letter.truncated and letter.error == "unsupported PlanMessage version v=2"
