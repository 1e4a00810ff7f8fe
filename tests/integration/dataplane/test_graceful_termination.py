"""Graceful termination as a kubelet does it: a deleted pod (directly, or by its Job when the
JobSet is suspended) stays in the API with ``deletionTimestamp``/``deletionGracePeriodSeconds``
while its containers get SIGTERM, a ``Killing`` event says so, SIGKILL follows after the grace
period, and the kubelet's final delete removes it."""
from __future__ import annotations

import uuid
from pathlib import Path

from fixtures.dataplane import jobset_object, replicated_job, wait_until
from trainyard.kube.resources import JOBSET, Resource

POD = Resource("", "v1", "pods", "Pod")
EVENT = Resource("", "v1", "events", "Event")
HOLD = "example.com/hold"  # a finalizer of the test's own, to read a deleted pod's last status

# Records SIGTERM in a host file (pods share the host's /tmp), then exits 0 unless told to
# ignore it (then only SIGKILL ends it).
TRAPPER = """
import os, signal, sys, time
path, ignore = sys.argv[1], sys.argv[2] == "ignore"
def on_term(signum, frame):
    with open(path, "a") as f:
        f.write("SIGTERM\\n")
    if not ignore:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(path, "a") as f:
    f.write("started\\n")
while True:
    time.sleep(0.2)
"""


def _marker() -> Path:
    return Path("/tmp") / f"ty-grace-{uuid.uuid4().hex[:8]}"


def _pod(name: str, marker: Path, mode: str, grace: int, finalizers: list[str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, **({"finalizers": finalizers} if finalizers else {})},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": "local",
                                     "command": ["python", "-c", TRAPPER, str(marker), mode]}]}}


async def _started(marker: Path) -> bool:
    return marker.exists() and "started" in marker.read_text()


async def _killing_events(kube, ns: str, pod_name: str) -> list[dict]:
    events, _ = await kube.list(EVENT, ns)
    return [e for e in events if e["involvedObject"].get("name") == pod_name and e.get("reason") == "Killing"]


async def test_deleted_pod_gets_sigterm_is_shown_terminating_then_goes(dataplane_cluster, kube, ns):
    marker = _marker()
    try:
        await kube.create(POD, ns, _pod("trapper", marker, "exit", 60, [HOLD]))
        await wait_until(lambda: _started(marker), what="the container's trap installed")
        await kube.request("DELETE", POD.path(ns, "trapper"), body={"kind": "DeleteOptions", "apiVersion": "v1"})

        pod = await kube.get(POD, ns, "trapper")
        assert pod["metadata"]["deletionTimestamp"]
        assert pod["metadata"]["deletionGracePeriodSeconds"] == 60  # the pod's own grace period
        await wait_until(lambda: "SIGTERM" in marker.read_text(), what="SIGTERM reached the container")
        events = await wait_until(lambda: _killing_events(kube, ns, "trapper"), what="Killing event")
        assert events[0]["message"] == "Stopping container main"
        assert events[0]["type"] == "Normal"
        assert events[0]["source"]["component"] == "kubelet"
        assert events[0]["involvedObject"]["fieldPath"] == "spec.containers{main}"

        async def ended() -> dict | None:
            current = await kube.get(POD, ns, "trapper")
            # the kubelet's final delete (grace 0) leaves only our finalizer holding the pod
            return current if current["metadata"]["deletionGracePeriodSeconds"] == 0 else None
        final = await wait_until(ended, what="the kubelet's final delete")
        state = final["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state["exitCode"] == 0  # the trap's own exit: no SIGKILL was needed
        await kube.merge_patch(POD, ns, "trapper", {"metadata": {"finalizers": None}})
        assert await wait_until(lambda: _gone(kube, ns, "trapper"), what="pod gone")
    finally:
        marker.unlink(missing_ok=True)


async def test_sigkill_after_the_grace_period_given_by_the_delete(dataplane_cluster, kube, ns):
    marker = _marker()
    try:
        await kube.create(POD, ns, _pod("stubborn", marker, "ignore", 600, [HOLD]))
        await wait_until(lambda: _started(marker), what="the container's trap installed")
        # kubectl delete --grace-period=2: shorter than the pod's 600 s
        await kube.request("DELETE", POD.path(ns, "stubborn"),
                           body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 2})
        pod = await kube.get(POD, ns, "stubborn")
        assert pod["metadata"]["deletionGracePeriodSeconds"] == 2

        async def ended() -> dict | None:
            current = await kube.get(POD, ns, "stubborn")
            return current if current["metadata"]["deletionGracePeriodSeconds"] == 0 else None
        final = await wait_until(ended, what="the kubelet's final delete")
        assert "SIGTERM" in marker.read_text()  # asked first, ignored
        state = final["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state["exitCode"] == 137  # then killed
        assert final["status"]["phase"] == "Failed"
        await kube.merge_patch(POD, ns, "stubborn", {"metadata": {"finalizers": None}})
        assert await wait_until(lambda: _gone(kube, ns, "stubborn"), what="pod gone")
    finally:
        marker.unlink(missing_ok=True)


async def test_a_longer_second_delete_does_not_extend_the_grace_period(dataplane_cluster, kube, ns):
    marker = _marker()
    try:
        await kube.create(POD, ns, _pod("twice", marker, "ignore", 30, [HOLD]))
        await wait_until(lambda: _started(marker), what="the container's trap installed")
        await kube.request("DELETE", POD.path(ns, "twice"),
                           body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 20})
        await kube.request("DELETE", POD.path(ns, "twice"),
                           body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 25})
        pod = await kube.get(POD, ns, "twice")
        assert pod["metadata"]["deletionGracePeriodSeconds"] == 20
        # a forced delete (grace 0) ends it at once; our finalizer still holds the object
        await kube.request("DELETE", POD.path(ns, "twice"),
                           body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        pod = await kube.get(POD, ns, "twice")
        assert pod["metadata"]["deletionGracePeriodSeconds"] == 0
        await kube.merge_patch(POD, ns, "twice", {"metadata": {"finalizers": None}})
        assert await wait_until(lambda: _gone(kube, ns, "twice"), what="pod gone")
    finally:
        marker.unlink(missing_ok=True)


async def test_suspending_a_jobset_terminates_its_pods_gracefully(dataplane_cluster, kube, ns):
    marker = _marker()
    try:
        job = replicated_job("w", ["python", "-c", TRAPPER, str(marker), "exit"])
        job["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 45
        await kube.create(JOBSET, ns, jobset_object("js", ns, [job]))
        await wait_until(lambda: _started(marker), what="the container's trap installed")
        pods, _ = await kube.list(POD, ns)
        name = pods[0]["metadata"]["name"]
        await kube.merge_patch(JOBSET, ns, "js", {"spec": {"suspend": True}})
        await wait_until(lambda: "SIGTERM" in marker.read_text(), what="SIGTERM reached the container")
        events = await wait_until(lambda: _killing_events(kube, ns, name), what="Killing event")
        assert events[0]["message"] == "Stopping container c"
        assert await wait_until(lambda: _no_pods(kube, ns), what="the suspended JobSet's pods gone")
    finally:
        marker.unlink(missing_ok=True)
        await kube.request("DELETE", JOBSET.path(ns, "js"), body={"propagationPolicy": "Foreground"})


async def _gone(kube, ns: str, name: str) -> bool:
    return await kube.get(POD, ns, name) is None


async def _no_pods(kube, ns: str) -> bool:
    pods, _ = await kube.list(POD, ns)
    return not pods


