"""JOBSET-DATAPLANE.md conformance items against a real devcluster and real processes."""
from __future__ import annotations

import asyncio
import hashlib

import pytest

from fixtures.dataplane import jobset_object, pids_of_pod, replicated_job, wait_until
from trainyard.kube.resources import CONFIGMAP, EVENT, JOBSET, Resource

NAMESPACE = Resource("", "v1", "namespaces", "Namespace", False)
POD = Resource("", "v1", "pods", "Pod")
JOB = Resource("batch", "v1", "jobs", "Job")
SERVICE = Resource("", "v1", "services", "Service")
PY = "python3"


async def items(kube, resource, namespace):
    found, _ = await kube.list(resource, namespace)
    return found


async def jobset_condition(kube, namespace, name, kind):
    js = await kube.get(JOBSET, namespace, name)
    for condition in ((js or {}).get("status") or {}).get("conditions") or []:
        if condition["type"] == kind and condition["status"] == "True":
            return condition
    return None


def log_of(cluster, pod, container="c", previous=False):
    meta = pod["metadata"]
    suffix = ".previous.log" if previous else ".log"
    path = cluster.data_dir / "pods" / meta["namespace"] / meta["name"] / f"{container}{suffix}"
    return path.read_text() if path.exists() else ""


async def test_children_labels_service_dns_status_and_completion(dataplane_cluster, kube, ns):
    env = [{"name": "R", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
           {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}}]
    js = jobset_object("js", ns, [
        replicated_job("a", ["sh", "-c", "echo $JOB_COMPLETION_INDEX $HOSTNAME; sleep 1.5"], replicas=2),
        replicated_job("b", ["echo", "$(R)", "$(N)", "$(UNDEFINED)", "$$(R)"], env=env)])
    created = await kube.create(JOBSET, ns, js)
    uid = created["metadata"]["uid"]

    # While running: counters name-descending, all five present; no conditions.
    async def running():
        status = ((await kube.get(JOBSET, ns, "js")) or {}).get("status") or {}
        entries = status.get("replicatedJobsStatus") or []
        return entries if entries and entries[-1]["name"] == "a" and entries[-1]["active"] == 2 else None
    entries = await wait_until(running, what="replicated job a active")
    assert [e["name"] for e in entries] == ["b", "a"]
    assert set(entries[1]) == {"name", "ready", "succeeded", "failed", "active", "suspended"}

    jobs = {j["metadata"]["name"]: j for j in await items(kube, JOB, ns)}
    assert sorted(jobs) == ["js-a-0", "js-a-1", "js-b-0"]
    expected = {"js-a-0": ("a", "2", "0", "0"), "js-a-1": ("a", "2", "1", "1"), "js-b-0": ("b", "1", "0", "2")}
    for name, (rjob, rjob_replicas, index, global_index) in expected.items():
        job = jobs[name]
        keys = {"jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/jobset-uid": uid,
                "jobset.sigs.k8s.io/replicatedjob-name": rjob, "jobset.sigs.k8s.io/restart-attempt": "0",
                "jobset.sigs.k8s.io/replicatedjob-replicas": rjob_replicas, "jobset.sigs.k8s.io/global-replicas": "3",
                "jobset.sigs.k8s.io/job-index": index, "jobset.sigs.k8s.io/job-global-index": global_index,
                "jobset.sigs.k8s.io/group-name": "default", "jobset.sigs.k8s.io/group-replicas": "3",
                "jobset.sigs.k8s.io/job-group-index": global_index,
                "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{ns}/{name}".encode()).hexdigest()}
        for where in (job["metadata"], job["spec"]["template"]["metadata"]):
            assert keys.items() <= where["labels"].items()
            assert keys.items() <= where["annotations"].items()
        assert job["metadata"]["ownerReferences"] == [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                                       "name": "js", "uid": uid, "controller": True,
                                                       "blockOwnerDeletion": True}]
        assert job["spec"]["suspend"] is False
        assert job["spec"]["template"]["spec"]["subdomain"] == "js"
    service = await kube.get(SERVICE, ns, "js")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"jobset.sigs.k8s.io/jobset-name": "js"}
    assert service["spec"]["publishNotReadyAddresses"] is True and not service["spec"].get("ports")
    assert service["metadata"]["ownerReferences"][0]["uid"] == uid

    completed = await wait_until(lambda: jobset_condition(kube, ns, "js", "Completed"), what="Completed")
    assert (completed["reason"], completed["message"]) == ("AllJobsCompleted", "jobset completed successfully")
    final = await kube.get(JOBSET, ns, "js")
    assert final["status"]["terminalState"] == "Completed"
    assert [c["type"] for c in final["status"]["conditions"]] == ["Completed"]
    assert {e["name"]: e["succeeded"] for e in final["status"]["replicatedJobsStatus"]} == {"a": 2, "b": 1}

    pods = await items(kube, POD, ns)
    assert len(pods) == 3
    for pod in pods:
        meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
        job_name = meta["labels"]["batch.kubernetes.io/job-name"]
        index = meta["annotations"]["batch.kubernetes.io/job-completion-index"]
        assert meta["name"].startswith(f"{job_name}-{index}-") and len(meta["name"]) == len(job_name) + len(index) + 7
        assert spec["hostname"] == f"{job_name}-{index}" and spec["subdomain"] == "js"
        assert status["phase"] == "Succeeded"
        terminated = status["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
        conditions = {c["type"]: c for c in status["conditions"]}
        assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "PodCompleted")
        assert conditions["Initialized"]["reason"] == "PodCompleted"
        expected_log = "0 js $(UNDEFINED) $(R)\n" if job_name == "js-b-0" else f"0 {job_name}-0\n"
        assert log_of(dataplane_cluster, pod) == expected_log
    job = await kube.get(JOB, ns, "js-a-0")
    assert job["status"]["succeeded"] == 1 and job["status"]["completedIndexes"] == "0"
    assert [c["type"] for c in job["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    events = await wait_until(lambda: _events(kube, ns, "AllJobsCompleted"), what="event")
    assert events[0]["involvedObject"]["kind"] == "JobSet" and events[0]["firstTimestamp"]


async def describe(kube, ns):
    """The namespace's JobSets, Jobs and pods, for a failure message."""
    lines = []
    for resource in (JOBSET, JOB, POD):
        for obj in await items(kube, resource, ns):
            meta = obj["metadata"]
            lines.append(f"{resource.kind} {meta['name']} finalizers={meta.get('finalizers')} "
                         f"deleting={bool(meta.get('deletionTimestamp'))} status={obj.get('status')}")
    return "\n".join(lines)


async def _events(kube, ns, reason):
    return [e for e in await items(kube, EVENT, ns) if e.get("reason") == reason]


async def test_dns_names_and_shared_port_across_two_jobsets(dataplane_cluster, kube, ns):
    server = ("import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              "s.bind(('0.0.0.0', 29500)); s.listen()\nc,_=s.accept(); print('got', c.recv(5).decode())")
    client = ("import socket,time,os,subprocess\nhost=os.environ['MASTER']\nfor _ in range(600):\n  try:\n"
              "    s=socket.create_connection((host, 29500)); break\n  except OSError: time.sleep(0.1)\n"
              "print(subprocess.run(['getent', 'hosts', host + '.' + os.environ['NS'] + '.svc.cluster.local'],"
              " capture_output=True, text=True).stdout.strip(), flush=True)\n"
              "s.send(b'hello'); print('sent')")
    for name in ("one", "two"):
        command = ["sh", "-c", f"if [ $JOB_COMPLETION_INDEX = 0 ]; then exec {PY} -c \"$SERVER\"; "
                               f"else exec {PY} -c \"$CLIENT\"; fi"]
        env = [{"name": "SERVER", "value": server}, {"name": "CLIENT", "value": client}, {"name": "NS", "value": ns},
               {"name": "MASTER", "value": f"{name}-w-0-0.{name}"}]
        await kube.create(JOBSET, ns, jobset_object(name, ns, [replicated_job(
            "w", command, parallelism=2, completions=2, env=env)]))
    for name in ("one", "two"):
        await wait_until(lambda: jobset_condition(kube, ns, name, "Completed"), timeout=60, what=f"{name} Completed")
    pods = {p["metadata"]["name"]: p for p in await items(kube, POD, ns)}
    for name in ("one", "two"):
        index0 = next(p for n, p in pods.items() if n.startswith(f"{name}-w-0-0-"))
        index1 = next(p for n, p in pods.items() if n.startswith(f"{name}-w-0-1-"))
        assert log_of(dataplane_cluster, index0) == "got hello\n"
        lines = log_of(dataplane_cluster, index1).splitlines()
        assert lines[0].split()[0] == index0["status"]["podIP"]
        assert f"{name}-w-0-0.{name}.{ns}.svc.cluster.local" in lines[0].split()
        assert lines[-1] == "sent"


async def test_failed_job_fails_jobset_and_stops_the_others(dataplane_cluster, kube, ns):
    command = ["sh", "-c", "if [ \"$(cat /etc/hostname 2>/dev/null)\" ]; then :; fi; "
                           "case $HOSTNAME in js-a-1-0) sleep 0.5; exit 3;; *) exec sleep 300;; esac"]
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job("a", command, replicas=2)]))
    running = await wait_until(lambda: _running_pod(kube, ns, "js-a-0-0-"), what="js-a-0 running")
    failed = await wait_until(lambda: jobset_condition(kube, ns, "js", "Failed"), timeout=60, what="Failed")
    assert failed["reason"] == "FailedJobs"
    assert failed["message"] == "jobset failed due to one or more job failures (first failed job: js-a-1)"
    job = await kube.get(JOB, ns, "js-a-1")
    by_type = {c["type"]: c for c in job["status"]["conditions"]}
    assert (by_type["Failed"]["reason"], by_type["Failed"]["message"]) == (
        "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    assert "FailureTarget" in by_type and job["status"]["failed"] == 1
    pod = next(p for p in await items(kube, POD, ns) if p["metadata"]["name"].startswith("js-a-1-0-"))
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert pod["status"]["phase"] == "Failed" and (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    # The other, unfinished Job is deleted and its process is gone.
    await wait_until(lambda: _gone(kube, JOB, ns, "js-a-0"), timeout=60, what="js-a-0 deleted")
    await wait_until(lambda: not pids_of_pod(running["metadata"]["uid"]), what="process gone")
    assert (await kube.get(JOBSET, ns, "js"))["status"]["terminalState"] == "Failed"


async def _running_pod(kube, ns, prefix):
    for pod in await items(kube, POD, ns):
        if pod["metadata"]["name"].startswith(prefix) and (pod.get("status") or {}).get("phase") == "Running":
            return pod
    return None


async def _gone(kube, resource, ns, name):
    return await kube.get(resource, ns, name) is None


async def test_on_failure_restart_then_backoff_limit(dataplane_cluster, kube, ns):
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job(
        "w", ["sh", "-c", "echo run; exit 1"], restart_policy=None, backoff_limit=0)]))
    failed = await wait_until(lambda: jobset_condition(kube, ns, "js", "Failed"), timeout=60, what="Failed")
    assert failed["reason"] == "FailedJobs"
    job = await kube.get(JOB, ns, "js-w-0")
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert next(c for c in job["status"]["conditions"] if c["type"] == "Failed")["reason"] == "BackoffLimitExceeded"


async def test_restart_policy_recreates_jobs_then_reaches_max_restarts(dataplane_cluster, kube, ns):
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job(
        "w", ["sh", "-c", "sleep 0.3; exit 1"])], failurePolicy={"maxRestarts": 1}))
    failed = await wait_until(lambda: jobset_condition(kube, ns, "js", "Failed"), timeout=60, what="Failed")
    assert failed["reason"] == "ReachedMaxRestarts"
    assert failed["message"] == "jobset failed due to reaching max number of restarts (first failed job: js-w-0)"
    status = (await kube.get(JOBSET, ns, "js"))["status"]
    assert status["restarts"] == 1 and status["restartsCountTowardsMax"] == 1
    job = await kube.get(JOB, ns, "js-w-0")
    assert job["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
    restarts = await _events(kube, ns, "RestartJobSetFailurePolicyAction")
    assert restarts and restarts[0]["message"].endswith("(first failed job: js-w-0)")


async def test_success_policy_any_deletes_unfinished_jobs(dataplane_cluster, kube, ns):
    await kube.create(JOBSET, ns, jobset_object("js", ns, [
        replicated_job("a", ["sleep", "300"]), replicated_job("b", ["sh", "-c", "sleep 1"])],
        successPolicy={"operator": "Any", "targetReplicatedJobs": ["b"]}))
    sleeper = await wait_until(lambda: _running_pod(kube, ns, "js-a-0-0-"), what="sleeper running")
    await wait_until(lambda: jobset_condition(kube, ns, "js", "Completed"), timeout=60, what="Completed")
    await wait_until(lambda: _gone(kube, JOB, ns, "js-a-0"), timeout=60, what="js-a-0 deleted")
    await wait_until(lambda: not pids_of_pod(sleeper["metadata"]["uid"]), what="sleeper stopped")
    remaining = [p["metadata"]["name"] for p in await items(kube, POD, ns)]
    assert len(remaining) == 1 and remaining[0].startswith("js-b-0-0-")


async def test_suspend_then_resume(dataplane_cluster, kube, ns):
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job("w", ["sh", "-c", "sleep 0.5"], replicas=2)],
                                                suspend=True))
    suspended = await wait_until(lambda: jobset_condition(kube, ns, "js", "Suspended"), what="Suspended")
    assert (suspended["reason"], suspended["message"]) == ("SuspendedJobs", "jobset is suspended")
    async def jobs_suspended():
        jobs = await items(kube, JOB, ns)
        return len(jobs) == 2 and all(j["spec"]["suspend"] for j in jobs) and all(
            any(c["type"] == "Suspended" and c["reason"] == "JobSuspended" for c in (j.get("status") or {}).get("conditions") or [])
            for j in jobs)
    await wait_until(jobs_suspended, what="jobs suspended")
    assert await items(kube, POD, ns) == []
    status = (await kube.get(JOBSET, ns, "js"))["status"]
    assert {e["name"]: e["suspended"] for e in status["replicatedJobsStatus"]} == {"w": 2}
    await kube.merge_patch(JOBSET, ns, "js", {"spec": {"suspend": False}})
    await wait_until(lambda: jobset_condition(kube, ns, "js", "Completed"), timeout=60, what="Completed")
    conditions = {c["type"]: c for c in (await kube.get(JOBSET, ns, "js"))["status"]["conditions"]}
    assert (conditions["Suspended"]["status"], conditions["Suspended"]["reason"]) == ("False", "ResumeJobs")


async def test_deleting_a_running_jobset_leaves_no_process(dataplane_cluster, kube, ns):
    command = ["sh", "-c", "setsid sleep 300 & sleep 300"]
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job("w", command, parallelism=2, completions=2)]))
    async def both_running():
        pods = [p for p in await items(kube, POD, ns) if (p.get("status") or {}).get("phase") == "Running"]
        return pods if len(pods) == 2 else None
    pods = await wait_until(both_running, what="pods running")
    uids = [p["metadata"]["uid"] for p in pods]
    await wait_until(lambda: all(len(pids_of_pod(uid)) >= 2 for uid in uids), what="processes visible")
    await kube.request("DELETE", JOBSET.path(ns, "js"), body={"propagationPolicy": "Foreground"})
    await wait_until(lambda: _gone(kube, JOBSET, ns, "js"), timeout=60, what="JobSet gone")
    await wait_until(lambda: not any(pids_of_pod(uid) for uid in uids), what="processes gone")
    assert await items(kube, JOB, ns) == []
    await wait_until(lambda: _no_pods(kube, ns), what="pods gone")


async def _no_pods(kube, ns):
    return await items(kube, POD, ns) == []


async def test_active_deadline_fails_the_job(dataplane_cluster, kube, ns):
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job("w", ["sleep", "60"], activeDeadlineSeconds=2)]))
    failed = await wait_until(lambda: jobset_condition(kube, ns, "js", "Failed"), timeout=60, what="Failed")
    assert failed["reason"] == "FailedJobs"
    job = await kube.get(JOB, ns, "js-w-0")
    condition = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert (condition["reason"], condition["message"]) == ("DeadlineExceeded", "Job was active longer than specified deadline")


async def test_missing_configmap_holds_the_container_until_created(dataplane_cluster, kube, ns):
    env = [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "late", "key": "v"}}}]
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job("w", ["sh", "-c", "echo $V"], env=env)]))
    async def waiting():
        for pod in await items(kube, POD, ns):
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                state = status["state"].get("waiting") or {}
                if state.get("reason") == "CreateContainerConfigError":
                    return pod, state
        return None
    pod, state = await wait_until(waiting, what="CreateContainerConfigError")
    assert state["message"] == 'configmap "late" not found' and pod["status"]["phase"] == "Pending"
    await kube.create(CONFIGMAP, ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"},
                                      "data": {"v": "arrived"}})
    await wait_until(lambda: jobset_condition(kube, ns, "js", "Completed"), timeout=60, what="Completed")
    assert log_of(dataplane_cluster, pod) == "arrived\n"


async def test_managed_by_another_controller_is_left_alone_and_ttl_deletes(dataplane_cluster, kube, ns):
    await kube.create(JOBSET, ns, jobset_object("other", ns, [replicated_job("w", ["true"])],
                                                managedBy="example.com/other"))
    await kube.create(JOBSET, ns, jobset_object("short", ns, [replicated_job("w", ["true"])],
                                                ttlSecondsAfterFinished=1))
    # Completed, then deleted 1 s later: a poll for the Completed condition can miss that second
    # on a loaded machine, so wait for the deletion and read the completion from its Event.
    try:
        await wait_until(lambda: _gone(kube, JOBSET, ns, "short"), timeout=60, what="ttl deletion")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{await describe(kube, ns)}") from None
    assert [e for e in await _events(kube, ns, "AllJobsCompleted") if e["involvedObject"]["name"] == "short"]
    other = await kube.get(JOBSET, ns, "other")
    assert not other.get("status") and not [j for j in await items(kube, JOB, ns)
                                            if j["metadata"]["name"].startswith("other-")]


async def test_deleted_service_is_recreated(dataplane_cluster, kube, ns):
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job("w", ["sleep", "30"])]))
    first = await wait_until(lambda: kube.get(SERVICE, ns, "js"), what="service")
    await kube.request("DELETE", SERVICE.path(ns, "js"), body={})
    second = await wait_until(lambda: _recreated(kube, ns, first["metadata"]["uid"]), what="service recreated")
    assert second["spec"]["selector"] == first["spec"]["selector"]
    await kube.request("DELETE", JOBSET.path(ns, "js"), body={"propagationPolicy": "Foreground"})


async def _recreated(kube, ns, old_uid):
    service = await kube.get(SERVICE, ns, "js")
    return service if service and service["metadata"]["uid"] != old_uid else None


async def test_admission_defaults_and_rejections(dataplane_cluster, kube, ns):
    from trainyard.kube.client import KubeError

    bare = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js", "namespace": ns},
            "spec": {"suspend": True,
                     "replicatedJobs": [{"name": "w", "template": {"spec": {"template": {"spec": {
                         "containers": [{"name": "c", "image": "x", "command": ["true"]}]}}}}}]}}
    stored = await kube.create(JOBSET, ns, bare)
    spec = stored["spec"]
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert spec["replicatedJobs"][0]["replicas"] == 1 and spec["replicatedJobs"][0]["groupName"] == "default"
    assert spec["replicatedJobs"][0]["template"]["spec"]["completionMode"] == "Indexed"
    assert spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"

    # Suspended: a pod-template label may change; replicas may not.
    labelled = {"spec": {"replicatedJobs": [dict(spec["replicatedJobs"][0], template={"spec": dict(
        spec["replicatedJobs"][0]["template"]["spec"], template=dict(
            spec["replicatedJobs"][0]["template"]["spec"]["template"], metadata={"labels": {"added": "yes"}}))})]}}
    await kube.merge_patch(JOBSET, ns, "js", labelled)
    with pytest.raises(KubeError) as denied:
        await kube.merge_patch(JOBSET, ns, "js", {"spec": {"replicatedJobs": [dict(spec["replicatedJobs"][0], replicas=2)]}})
    assert "field is immutable" in denied.value.message

    for change, message in [
        ({"successPolicy": {"operator": "All", "targetReplicatedJobs": ["nope"]}},
         "invalid replicatedJob name 'nope' does not appear in .spec.ReplicatedJobs"),
        ({"failurePolicy": {"rules": [{"name": "r", "action": "FailJobSet"}, {"name": "r", "action": "FailJobSet"}]}},
         "rule names are not unique, rules with indices [0 1] all have the same name 'r'"),
    ]:
        doc = dict(bare, metadata={"name": "bad", "namespace": ns}, spec=dict(bare["spec"], **change))
        with pytest.raises(KubeError) as rejected:
            await kube.create(JOBSET, ns, doc)
        assert message in rejected.value.message
    await kube.merge_patch(JOBSET, ns, "js", {"spec": {"suspend": False}})
    await wait_until(lambda: jobset_condition(kube, ns, "js", "Completed"), timeout=60, what="Completed")
    job = await kube.get(JOB, ns, "js-w-0")
    assert job["spec"]["template"]["metadata"]["labels"]["added"] == "yes"


async def test_suspend_a_running_jobset_then_resume(dataplane_cluster, kube, ns):
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job("w", ["sleep", "300"], parallelism=2, completions=2)]))

    async def running_pods():
        pods = [p for p in await items(kube, POD, ns) if (p.get("status") or {}).get("phase") == "Running"]
        return pods if len(pods) == 2 else None
    before = await wait_until(running_pods, what="pods running")
    old_uids = {p["metadata"]["uid"] for p in before}
    await wait_until(lambda: all(pids_of_pod(uid) for uid in old_uids), what="processes")
    await kube.merge_patch(JOBSET, ns, "js", {"spec": {"suspend": True}})
    suspended = await wait_until(lambda: jobset_condition(kube, ns, "js", "Suspended"), what="Suspended")
    assert suspended["reason"] == "SuspendedJobs"
    await wait_until(lambda: _no_pods(kube, ns), what="pods removed")
    assert not any(pids_of_pod(uid) for uid in old_uids)
    job = await kube.get(JOB, ns, "js-w-0")
    assert job["spec"]["suspend"] is True and job["status"]["active"] == 0 and job["status"].get("failed", 0) == 0

    await kube.merge_patch(JOBSET, ns, "js", {"spec": {"suspend": False}})
    after = await wait_until(running_pods, what="fresh pods running")
    assert not old_uids & {p["metadata"]["uid"] for p in after}
    status = (await kube.get(JOBSET, ns, "js"))["status"]
    assert status["restarts"] == 0
    resumed = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert (resumed["status"], resumed["reason"], resumed["message"]) == ("False", "ResumeJobs", "jobset is resumed")
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in after} == {"0"}
    await kube.request("DELETE", JOBSET.path(ns, "js"), body={"propagationPolicy": "Foreground"})
    await wait_until(lambda: _gone(kube, JOBSET, ns, "js"), what="deleted")


@pytest.mark.parametrize("strategy", ["BlockingRecreate", "Recreate"])
async def test_restart_strategy_with_a_slow_to_stop_pod(dataplane_cluster, kube, ns, strategy):
    script = ('if [ "$A" = 0 ] && [ "$HOSTNAME" = js-w-0-0 ]; then sleep 1; exit 1; fi; '
              'if [ "$A" = 0 ] && [ "$HOSTNAME" = js-w-2-0 ]; then trap "sleep 3; exit 0" TERM; '
              'while true; do sleep 0.1; done; fi; '
              'if [ "$A" = 0 ]; then exec sleep 300; fi; exit 0')
    env = [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}}}]
    await kube.create(JOBSET, ns, jobset_object("js", ns, [replicated_job("w", ["sh", "-c", script], replicas=3, env=env)],
                                                failurePolicy={"maxRestarts": 1, "restartStrategy": strategy}))
    overlapped = False
    deadline = asyncio.get_running_loop().time() + 60
    while not await jobset_condition(kube, ns, "js", "Completed"):
        assert asyncio.get_running_loop().time() < deadline, await items(kube, JOB, ns)
        attempts = {j["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for j in await items(kube, JOB, ns)}
        overlapped = overlapped or attempts == {"0", "1"}
        assert not await jobset_condition(kube, ns, "js", "Failed")
        await asyncio.sleep(0.05)
    assert (await kube.get(JOBSET, ns, "js"))["status"]["restarts"] == 1
    assert overlapped is (strategy == "Recreate")


async def test_indexed_job_without_completions_is_a_creation_error(dataplane_cluster, kube, ns):
    rjob = replicated_job("w", ["true"], parallelism=2)
    del rjob["template"]["spec"]["completions"]
    await kube.create(JOBSET, ns, jobset_object("js", ns, [rjob]))
    events = await wait_until(lambda: _events(kube, ns, "JobCreationFailed"), what="JobCreationFailed event")
    assert "completions" in events[0]["message"] and events[0]["type"] == "Warning"
    assert await items(kube, JOB, ns) == []
    assert "conditions" not in ((await kube.get(JOBSET, ns, "js")).get("status") or {})
    await kube.request("DELETE", JOBSET.path(ns, "js"), body={})
