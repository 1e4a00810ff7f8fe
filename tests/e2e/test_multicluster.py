"""Multi-cluster delegation end to end: `trainyard up --workers 2` (a manager and two worker
devclusters, each with its own services, one NATS, the dispatcher), driven with kubectl.

TrainJobs with `spec.managedBy: kueue.x-k8s.io/multikueue` are applied on the manager; they
must run on exactly one worker, with the worker's status mirrored back.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.stack import KUBECTL, RunningStack, skip_unless_stack_available, start_stack
from fixtures.trainers import chart_points, reporting_command, wait_for_charts
from fixtures.waiting import wait_for as poll

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

LOST_TIMEOUT_S = 6
MANAGED_BY = "kueue.x-k8s.io/multikueue"
ORIGIN = "kueue.x-k8s.io/multikueue-origin"
WORKER_ANNOTATION = "trainyard.kubeflow.org/worker-cluster"
WORKERS = ("worker-1", "worker-2")


def runtime(name: str, command: str, cpu: str | None = None) -> dict:
    """A plain ClusterTrainingRuntime whose single node runs ``command`` locally."""
    container = {"name": "node", "image": "busybox", "command": ["/bin/sh", "-c", command]}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [{
            "name": "node",
            "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                         "spec": {"template": {"spec": {"containers": [container]}}}},
        }]}}},
    }


def delegated(name: str, runtime_name: str, **spec) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"managedBy": MANAGED_BY, "runtimeRef": {"name": runtime_name}, **spec}}


class Clusters:
    """kubectl against the manager or a worker of the running stack."""

    def __init__(self, stack: RunningStack) -> None:
        self.stack = stack
        self.kubeconfigs = {name: Path(info["kubeconfig"]) for name, info in stack.state["clusters"].items()}

    def kubectl(self, cluster: str, *args: str, check: bool = True, stdin: str | None = None):
        cache = self.stack.data_dir.parent / f"kubectl-cache-{cluster}"
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.kubeconfigs[cluster]),
                                 f"--cache-dir={cache}", *args],
                                capture_output=True, text=True, timeout=60, input=stdin)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl ({cluster}) {' '.join(args)}: {result.stderr}")
        return result

    def apply(self, cluster: str, *docs: dict) -> None:
        self.kubectl(cluster, "apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))

    def get(self, cluster: str, kind: str, name: str | None = None, *selector: str):
        args = ["get", kind, *([name] if name else []), "-n", "default", "-o", "json", *selector]
        result = self.kubectl(cluster, *args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        return json.loads(result.stdout)

    def trainjobs(self, cluster: str) -> dict[str, dict]:
        return {tj["metadata"]["name"]: tj for tj in self.get(cluster, "trainjobs")["items"]}


def wait_for(predicate, timeout: float = 120.0, interval: float = 0.5, what: str = "condition"):
    """The services tests' poll, slower here: each poll runs kubectl against three clusters."""
    return poll(predicate, timeout=timeout, interval=interval, what=what)


def condition(obj: dict | None, kind: str) -> dict | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def is_true(obj: dict | None, kind: str) -> bool:
    found = condition(obj, kind)
    return found is not None and found["status"] == "True"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> RunningStack:
    skip_unless_stack_available(("watcher", "planner", "applier", "status", "dispatcher"))
    running = start_stack(tmp_path_factory.mktemp("multicluster") / "data", "--workers", "2",
                          "--worker-lost-timeout", str(LOST_TIMEOUT_S), timeout=300)
    try:
        yield running
    finally:
        running.stop()
        running.kill()


@pytest.fixture(scope="module")
def clusters(stack) -> Clusters:
    found = Clusters(stack)
    assert set(found.kubeconfigs) == {"manager", *WORKERS}
    runtimes = "\n---\n".join(json.dumps(r) for r in (runtime("mc-echo", "echo trained on $(hostname); sleep 1"),
                                                          runtime("mc-sleep", "sleep 600")))
    for cluster in found.kubeconfigs:
        # Runtimes pass each cluster's validating webhook; retried briefly, so that a webhook
        # answering late on a loaded machine fails the setup only if it stays down.
        wait_for(lambda: found.kubectl(cluster, "apply", "-f", "-", stdin=runtimes, check=False).returncode == 0,
                 timeout=30, what=f"runtimes applied on {cluster}")
    return found


def test_workers_are_registered_and_active(stack, clusters):
    table = wait_for(lambda: (lambda out: out if out.count("True") == 2 else None)(
        clusters.kubectl("manager", "get", "multikueueclusters").stdout), timeout=30, what="both workers Active")
    assert table.split("\n")[0].split()[:2] == ["NAME", "ACTIVE"]
    rows = {line.split()[0]: line.split()[1] for line in table.strip().split("\n")[1:]}
    assert rows == {"worker-1": "True", "worker-2": "True"}
    secret = clusters.kubectl("manager", "get", "secret", "worker-1-kubeconfig", "-n", "kubeflow-system",
                              "-o", "jsonpath={.data.kubeconfig}").stdout
    assert secret  # the kubeconfig lives in a Secret on the manager, as Kueue expects


def test_twenty_trainjobs_each_run_on_exactly_one_worker(stack, clusters):
    names = [f"mc-{index}" for index in range(20)]
    clusters.apply("manager", *(delegated(name, "mc-echo") for name in names))

    def all_complete():
        jobs = clusters.trainjobs("manager")
        done = [n for n in names if is_true(jobs.get(n), "Complete")]
        return jobs if len(done) == len(names) else None

    manager = wait_for(all_complete, timeout=240, what="20 delegated TrainJobs Complete on the manager")
    copies = {worker: clusters.trainjobs(worker) for worker in WORKERS}
    used = set()
    for name in names:
        worker = manager[name]["metadata"]["annotations"][WORKER_ANNOTATION]
        used.add(worker)
        other = next(w for w in WORKERS if w != worker)
        assert name in copies[worker] and name not in copies[other]
        copy = copies[worker][name]
        assert copy["metadata"]["labels"][ORIGIN] == "manager"
        # Written without managedBy: the worker's CRD default hands it to its own trainyard.
        assert copy["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
        # The manager shows the worker's condition, reason and message.
        mirrored, original = condition(manager[name], "Complete"), condition(copy, "Complete")
        assert (mirrored["reason"], mirrored["message"]) == (original["reason"], original["message"])
        assert manager[name]["status"].get("jobsStatus") == copy["status"].get("jobsStatus")
    assert used == set(WORKERS), "least-loaded placement spreads a burst over both workers"

    # Pods and JobSets exist on the workers only.
    assert clusters.get("manager", "pods")["items"] == []
    assert clusters.get("manager", "jobsets")["items"] == []
    pods = {w: [p for p in clusters.get(w, "pods")["items"]
                if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") in names] for w in WORKERS}
    ran = sorted(p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] for w in WORKERS for p in pods[w])
    # One pod each; a TrainJob without (or with two) says which, with its worker's JobSet status.
    assert ran == sorted(names), {n: (manager[n]["metadata"]["annotations"][WORKER_ANNOTATION], (clusters.get(
        manager[n]["metadata"]["annotations"][WORKER_ANNOTATION], "jobsets", n) or {}).get("status"))
        for n in names if ran.count(n) != 1}

    # `-o wide` shows the worker; an Event says where it went.
    wide = clusters.kubectl("manager", "get", "trainjob", "mc-0", "-o", "wide").stdout
    assert "CLUSTER" in wide.split("\n")[0]
    assert manager["mc-0"]["metadata"]["annotations"][WORKER_ANNOTATION] in wide.split("\n")[1]
    events = clusters.kubectl("manager", "get", "events", "-n", "default",
                              "--field-selector", "involvedObject.name=mc-0", "-o", "json").stdout
    reasons = [e["reason"] for e in json.loads(events)["items"]]
    assert reasons.count("Dispatched") == 1


def test_suspend_resume_and_delete_propagate(stack, clusters):
    clusters.apply("manager", delegated("mc-life", "mc-sleep"))
    manager = wait_for(lambda: (lambda tj: tj if tj and WORKER_ANNOTATION in tj["metadata"].get("annotations", {})
                                else None)(clusters.get("manager", "trainjob", "mc-life")), what="placement")
    worker = manager["metadata"]["annotations"][WORKER_ANNOTATION]
    wait_for(lambda: [p for p in clusters.get(worker, "pods")["items"]
                      if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == "mc-life"
                      and p["status"].get("phase") == "Running"], what="the copy's pod running")

    clusters.kubectl("manager", "patch", "trainjob", "mc-life", "-n", "default", "--type=merge",
                     "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: (clusters.get(worker, "trainjob", "mc-life") or {}).get("spec", {}).get("suspend") is True,
             what="suspend on the copy")
    wait_for(lambda: is_true(clusters.get("manager", "trainjob", "mc-life"), "Suspended"),
             what="Suspended mirrored to the manager")
    clusters.kubectl("manager", "patch", "trainjob", "mc-life", "-n", "default", "--type=merge",
                     "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: (clusters.get(worker, "trainjob", "mc-life") or {}).get("spec", {}).get("suspend") is False,
             what="resume on the copy")

    clusters.kubectl("manager", "delete", "trainjob", "mc-life", "-n", "default", "--wait=true", "--timeout=60s")
    wait_for(lambda: clusters.get(worker, "trainjob", "mc-life") is None, what="the copy deleted")
    assert clusters.get("manager", "trainjob", "mc-life") is None


def test_a_worker_without_the_runtime_is_not_chosen(stack, clusters):
    only_two = runtime("mc-only-on-2", "echo ok")
    clusters.apply("manager", only_two)
    clusters.apply("worker-2", only_two)
    names = [f"mc-rt-{index}" for index in range(4)]
    clusters.apply("manager", *(delegated(name, "mc-only-on-2") for name in names))
    jobs = wait_for(lambda: (lambda all_: all_ if all(is_true(all_.get(n), "Complete") for n in names) else None)(
        clusters.trainjobs("manager")), timeout=120, what="TrainJobs on worker-2 Complete")
    assert {jobs[n]["metadata"]["annotations"][WORKER_ANNOTATION] for n in names} == {"worker-2"}


def test_no_worker_fits_says_why_then_starts_when_capacity_frees(stack, clusters):
    node = json.loads(clusters.kubectl("worker-1", "get", "nodes", "-o", "json").stdout)["items"][0]
    cpus = int(node["status"]["allocatable"]["cpu"])
    big = f"{int(cpus * 1000 * 0.75)}m"  # one per worker fits, two on one worker do not
    for cluster in clusters.kubeconfigs:
        clusters.apply(cluster, runtime("mc-big", "sleep 600", cpu=big))
    clusters.apply("manager", delegated("mc-big-a", "mc-big"), delegated("mc-big-b", "mc-big"))
    placed = wait_for(lambda: (lambda all_: all_ if all(WORKER_ANNOTATION in all_.get(n, {}).get("metadata", {})
                                                        .get("annotations", {}) for n in ("mc-big-a", "mc-big-b"))
                               else None)(clusters.trainjobs("manager")), what="two big TrainJobs placed")
    assert {placed[n]["metadata"]["annotations"][WORKER_ANNOTATION] for n in ("mc-big-a", "mc-big-b")} == set(WORKERS)

    clusters.apply("manager", delegated("mc-big-c", "mc-big"))
    waiting = wait_for(lambda: (lambda c: c if c and c["status"] == "False" else None)(
        condition(clusters.get("manager", "trainjob", "mc-big-c"), "Dispatched")), what="a Dispatched=False condition")
    assert waiting["reason"] == "InsufficientCapacity"
    assert "no worker cluster has free capacity for cpu=" in waiting["message"]
    assert "waiting for capacity" in waiting["message"]
    assert WORKER_ANNOTATION not in (clusters.get("manager", "trainjob", "mc-big-c")["metadata"].get("annotations") or {})
    events = json.loads(clusters.kubectl("manager", "get", "events", "-n", "default", "--field-selector",
                                         "involvedObject.name=mc-big-c", "-o", "json").stdout)["items"]
    assert any(e["reason"] == "InsufficientCapacity" and e["type"] == "Warning" for e in events)

    freed = placed["mc-big-a"]["metadata"]["annotations"][WORKER_ANNOTATION]
    clusters.kubectl("manager", "delete", "trainjob", "mc-big-a", "-n", "default", "--wait=true", "--timeout=60s")
    # The placement is written before the copy is created, and Dispatched=True after it: wait
    # for the condition, not only the annotation (read between the two writes, it still says why
    # the TrainJob waited).
    started = wait_for(lambda: (lambda tj: tj if WORKER_ANNOTATION in tj["metadata"].get("annotations", {})
                                and is_true(tj, "Dispatched") else None)(
        clusters.get("manager", "trainjob", "mc-big-c")), timeout=60, what="mc-big-c dispatched once capacity freed")
    assert started["metadata"]["annotations"][WORKER_ANNOTATION] == freed
    for name in ("mc-big-b", "mc-big-c"):
        clusters.kubectl("manager", "delete", "trainjob", name, "-n", "default", "--wait=true", "--timeout=60s")


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_the_dashboard_shows_each_workers_state_capacity_and_trainjobs(stack, clusters):
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium not installed at {CHROMIUM} (`make system-tools` installs Debian's package)")
    from playwright.sync_api import expect, sync_playwright

    node = json.loads(clusters.kubectl("worker-1", "get", "nodes", "-o", "json").stdout)["items"][0]
    cpus = int(node["status"]["allocatable"]["cpu"])
    big = f"{int(cpus * 1000 * 0.75)}m"  # one per worker: the least-loaded placement spreads them
    reporting = runtime("mc-report", "true")
    reporting["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["command"] = reporting_command(4)
    for cluster in clusters.kubeconfigs:
        clusters.apply(cluster, runtime("mc-big", "sleep 600", cpu=big), reporting)
    names = ("mc-dash-a", "mc-dash-b")
    try:  # whatever fails, the later tests find no TrainJob of this one
        # A delegated TrainJob whose trainer (on a worker) reports 4 times: the manager's row
        # charts its worker copy's reports.
        clusters.apply("manager", delegated("mc-dash-curve", "mc-report"))
        wait_for(lambda: is_true(clusters.get("manager", "trainjob", "mc-dash-curve"), "Complete"),
                 what="mc-dash-curve")
        clusters.apply("manager", *(delegated(name, "mc-big") for name in names))
        for worker in WORKERS:
            wait_for(lambda: [p for p in clusters.get(worker, "pods")["items"]
                              if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") in names
                              and p["status"].get("phase") == "Running"], what=f"a big pod running on {worker}")
        counts = {worker: len(clusters.trainjobs(worker)) for worker in WORKERS}
        shots = stack.data_dir.parent / "screenshots"
        shots.mkdir(exist_ok=True)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1200})
                page.goto(stack.state["dashboard_url"])
                expect(page.locator("#connection")).to_have_text("live", timeout=20_000)
                expect(page.locator("#workers")).to_be_visible(timeout=20_000)
                for worker in WORKERS:
                    row = page.locator(f'#worker-table tr[data-worker="{worker}"]')
                    expect(row.locator("td").nth(1)).to_have_text("Active", timeout=20_000)
                    expect(row.locator('[data-resource="cpu"]')).to_have_text(
                        f"cpu {cpus * 0.75:g} / {cpus:g} cores", timeout=20_000)
                    expect(row.locator("td.worker-trainjobs")).to_have_text(
                        re.compile(rf"^{counts[worker]}( |$)"), timeout=20_000)
                wait_for_charts(page)
                chart = page.evaluate("""() => {
                    const data = document.getElementById('chart-workers').data;
                    return {workers: data[0].x, used: data[0].y, free: data[1].y};
                }""")
                assert chart == {"workers": list(WORKERS), "used": [cpus * 0.75] * 2, "free": [cpus * 0.25] * 2}
                page.locator("#workers").screenshot(path=str(shots / "dashboard-workers.png"))
                page.locator('#trainjobs tr[data-key="manager/default/mc-dash-curve"]').click()
                expect(page.locator("#progress-count")).to_have_text("4 reports", timeout=20_000)
                assert chart_points(page, "chart-trainjob", "loss") == {"data": 4, "drawn": 4}
                if os.environ.get("TRAINYARD_UPDATE_SCREENSHOT") == "1":
                    (REPO / "docs" / "images").mkdir(exist_ok=True)
                    (REPO / "docs" / "images" / "dashboard-workers.png").write_bytes(
                        (shots / "dashboard-workers.png").read_bytes())
            finally:
                browser.close()
    finally:
        for name in (*names, "mc-dash-curve"):
            clusters.kubectl("manager", "delete", "trainjob", name, "-n", "default", "--ignore-not-found",
                             "--wait=true", "--timeout=60s")


def test_two_dispatchers_never_copy_a_trainjob_twice(stack, clusters, tmp_path):
    second = subprocess.Popen(
        [sys.executable, "-m", "trainyard.cli.main", "dispatcher", "--kubeconfig", str(clusters.kubeconfigs["manager"]),
         "--nats-url", stack.nats_url, "--http-port", "0", "--cluster", "manager",
         "--worker-lost-timeout", str(LOST_TIMEOUT_S), "--probe-interval", "1", "--resync-interval", "2"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "dispatcher-2.log", "wb"),
        env={**os.environ, **stack.nats_env("dispatcher")})
    try:
        time.sleep(3)  # both replicas consuming
        names = [f"mc-pair-{index}" for index in range(10)]
        clusters.apply("manager", *(delegated(name, "mc-echo") for name in names))
        jobs = wait_for(lambda: (lambda all_: all_ if all(is_true(all_.get(n), "Complete") for n in names) else None)(
            clusters.trainjobs("manager")), timeout=180, what="TrainJobs Complete with two dispatchers")
        copies = {worker: clusters.trainjobs(worker) for worker in WORKERS}
        events = json.loads(clusters.kubectl("manager", "get", "events", "-n", "default", "-o", "json").stdout)["items"]
        for name in names:
            holders = [w for w in WORKERS if name in copies[w]]
            assert holders == [jobs[name]["metadata"]["annotations"][WORKER_ANNOTATION]]
            dispatched = [e for e in events if e["involvedObject"]["name"] == name and e["reason"] == "Dispatched"]
            assert len(dispatched) == 1, dispatched
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(timeout=20)
        except subprocess.TimeoutExpired:
            second.kill()
            second.wait()
    assert second.returncode == 0, (tmp_path / "dispatcher-2.log").read_text()[-2000:]


def test_the_dispatcher_stands_down_beside_kueue(stack, clusters):
    """Kueue's MultiKueue acts on the same managedBy value: while the manager serves Kueue's
    Workload API the dispatcher is unready, says why, and dispatches nothing."""
    import urllib.error
    import urllib.request

    port = stack.state["ports"]["dispatcher"]

    def readyz() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    workloads = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                 "metadata": {"name": "workloads.kueue.x-k8s.io"},
                 "spec": {"group": "kueue.x-k8s.io", "scope": "Namespaced",
                          "names": {"kind": "Workload", "listKind": "WorkloadList", "plural": "workloads",
                                    "singular": "workload"},
                          "versions": [{"name": "v1beta1", "served": True, "storage": True, "schema": {
                              "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    clusters.apply("manager", workloads)
    try:
        code, text = wait_for(lambda: (lambda answer: answer if answer[0] == 503 else None)(readyz()),
                              timeout=30, what="dispatcher unready")
        assert "kueue-multikueue-absent" in text
        events = json.loads(clusters.kubectl("manager", "get", "events", "-n", "kubeflow-system",
                                             "-o", "json").stdout)["items"]
        assert any(e["reason"] == "KueueInstalled" and "stands down" in e["message"] for e in events)
        clusters.apply("manager", delegated("mc-kueue", "mc-echo"))
        time.sleep(5)
        held = clusters.get("manager", "trainjob", "mc-kueue")
        assert WORKER_ANNOTATION not in (held["metadata"].get("annotations") or {})
        assert all(clusters.get(w, "trainjob", "mc-kueue") is None for w in WORKERS)
    finally:
        clusters.kubectl("manager", "delete", "crd", "workloads.kueue.x-k8s.io")
    wait_for(lambda: readyz()[0] == 200, timeout=30, what="dispatcher ready again")
    wait_for(lambda: is_true(clusters.get("manager", "trainjob", "mc-kueue"), "Complete"), timeout=90,
             what="dispatched once Kueue is gone")


def test_a_lost_worker_is_replaced_and_its_stale_copies_removed(stack, clusters):
    """Runs last: it kills worker-1's devcluster (process group, pods included) and keeps it
    down for longer than the lost timeout."""
    for cluster in clusters.kubeconfigs:
        clusters.apply(cluster, runtime("mc-long", "sleep 12"))
    names = [f"mc-lost-{index}" for index in range(4)]
    clusters.apply("manager", *(delegated(name, "mc-long") for name in names))
    placed = wait_for(lambda: (lambda all_: all_ if all(WORKER_ANNOTATION in all_.get(n, {}).get("metadata", {})
                                                        .get("annotations", {}) for n in names) else None)(
        clusters.trainjobs("manager")), what="placement")
    on_one = [n for n in names if placed[n]["metadata"]["annotations"][WORKER_ANNOTATION] == "worker-1"]
    assert on_one, "a burst is spread over both workers, so worker-1 runs some"
    wait_for(lambda: all(n in clusters.trainjobs("worker-1") for n in on_one), what="copies on worker-1")

    state = json.loads((stack.data_dir / "stack.json").read_text())
    victim = state["children"]["worker-1-devcluster"]["pid"]
    # The supervisor would restart the devcluster within a second: pause it while the worker
    # stays down for longer than the lost timeout (the other processes run on).
    os.kill(stack.pid, signal.SIGSTOP)
    killed_at = time.monotonic()
    os.killpg(victim, signal.SIGKILL)
    try:
        table = wait_for(lambda: (lambda out: out if "False" in out.split("worker-1", 1)[1].split("\n")[0] else None)(
            clusters.kubectl("manager", "get", "multikueueclusters", "-o", "wide").stdout),
            timeout=30, what="worker-1 Active=False")
        assert "ClientConnectionFailed" in table

        def moved():
            jobs = clusters.trainjobs("manager")
            return jobs if all(jobs[n]["metadata"].get("annotations", {}).get(WORKER_ANNOTATION) == "worker-2"
                               for n in on_one) else None

        wait_for(moved, timeout=60, what="re-dispatch to worker-2")
        redispatched_after = time.monotonic() - killed_at
        assert redispatched_after >= LOST_TIMEOUT_S
        events = json.loads(clusters.kubectl("manager", "get", "events", "-n", "default", "-o", "json").stdout)["items"]
        assert any(e["reason"] == "WorkerLost" and e["involvedObject"]["name"] == on_one[0] for e in events)
    finally:
        os.kill(stack.pid, signal.SIGCONT)
        resumed_at = time.monotonic()

    # Everything completes on worker-2 and the manager shows nothing of worker-1's copies.
    jobs = wait_for(lambda: (lambda all_: all_ if all(is_true(all_.get(n), "Complete") for n in names) else None)(
        clusters.trainjobs("manager")), timeout=120, what="every TrainJob Complete")
    for name in on_one:
        assert jobs[name]["metadata"]["annotations"][WORKER_ANNOTATION] == "worker-2"
        assert name in clusters.trainjobs("worker-2")
    # worker-1 comes back (the supervisor restarts it): its stale copies are deleted.
    wait_for(lambda: "True" in clusters.kubectl("manager", "get", "multikueueclusters").stdout.split("worker-1", 1)[1]
             .split("\n")[0], timeout=90, what="worker-1 Active again")
    back_after = time.monotonic() - resumed_at
    wait_for(lambda: not any(n in clusters.trainjobs("worker-1") for n in on_one), timeout=60,
             what="stale copies removed from worker-1")
    print(f"lost worker: re-dispatched {redispatched_after:.1f}s after the kill (lost timeout {LOST_TIMEOUT_S}s); "
          f"after the supervisor resumed: Active again in {back_after:.1f}s, {len(on_one)} stale copies gone "
          f"{time.monotonic() - resumed_at:.1f}s after the restart began")

